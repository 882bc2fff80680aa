//! Graph statistics and DOT export: what `MLXCEL_TRACE_DTYPE` and `MLXCEL_EXPORT_DECODE_DOT`
//! print.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use crate::dtype::DType;
use crate::graph::{Graph, NodeId};
use crate::op::Op;

/// One dtype conversion in a graph, with where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AsTypeInfo {
    pub node: NodeId,
    pub from: DType,
    pub to: DType,
    /// The builder call that inserted it (`"add"`, `"kv_write"`, `"astype"` when explicit).
    pub origin: &'static str,
    /// The op that produced the converted value.
    pub source_op: &'static str,
    pub layer: Option<u32>,
    /// The converted value's name, or its parameter/input name.
    pub tensor: Option<String>,
}

#[derive(Clone, Debug, Default)]
pub struct GraphStats {
    pub nodes: usize,
    pub by_op: BTreeMap<&'static str, usize>,
    pub astype: Vec<AsTypeInfo>,
}

pub fn stats(graph: &Graph) -> GraphStats {
    let mut s = GraphStats {
        nodes: graph.nodes.len(),
        ..Default::default()
    };
    for (i, node) in graph.nodes.iter().enumerate() {
        *s.by_op.entry(node.op.name()).or_default() += 1;
        if let Op::AsType = node.op {
            let src = graph.node(node.inputs[0]);
            let tensor = match &src.op {
                Op::Parameter { name, .. } | Op::Input { name } | Op::State { name } => Some(name.clone()),
                _ => src.name.as_ref().map(|n| n.to_string()),
            };
            s.astype.push(AsTypeInfo {
                node: NodeId(i as u32),
                from: src.dtype,
                to: node.dtype,
                origin: node.origin,
                source_op: src.op.name(),
                layer: node.layer,
                tensor,
            });
        }
    }
    s
}

/// AsType nodes that share a source op, origin, tensor (layer indices as `N`) and dtypes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AsTypeGroup {
    pub source_op: &'static str,
    pub origin: &'static str,
    pub tensor: Option<String>,
    pub from: DType,
    pub to: DType,
    pub count: usize,
    /// The layers its nodes belong to (empty: outside the layers).
    pub layers: Vec<u32>,
}

/// `model.layers.12.mlp` → `model.layers.N.mlp`: one name for the same tensor of every layer.
fn layer_pattern(name: &str) -> String {
    name.split('.')
        .map(|part| {
            if !part.is_empty() && part.bytes().all(|c| c.is_ascii_digit()) {
                "N"
            } else {
                part
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

impl GraphStats {
    /// The AsType nodes grouped by source (op, origin, tensor, from → to), most frequent first.
    pub fn astype_breakdown(&self) -> Vec<AsTypeGroup> {
        let mut groups: Vec<AsTypeGroup> = Vec::new();
        for a in &self.astype {
            let tensor = a.tensor.as_deref().map(layer_pattern);
            let found = groups.iter_mut().find(|g| {
                (g.source_op, g.origin, &g.tensor, g.from, g.to) == (a.source_op, a.origin, &tensor, a.from, a.to)
            });
            let g = match found {
                Some(g) => g,
                None => {
                    groups.push(AsTypeGroup {
                        source_op: a.source_op,
                        origin: a.origin,
                        tensor,
                        from: a.from,
                        to: a.to,
                        count: 0,
                        layers: Vec::new(),
                    });
                    groups.last_mut().expect("just pushed")
                }
            };
            g.count += 1;
            if let Some(l) = a.layer {
                if !g.layers.contains(&l) {
                    g.layers.push(l);
                }
            }
        }
        groups.sort_by_key(|g| std::cmp::Reverse(g.count));
        groups
    }
}

impl fmt::Display for AsTypeGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}× {} → {} for {} of {}",
            self.count, self.from, self.to, self.origin, self.source_op
        )?;
        if let Some(t) = &self.tensor {
            write!(f, " ({t})")?;
        }
        if !self.layers.is_empty() {
            let names: Vec<String> = self.layers.iter().map(|l| format!("L{l}")).collect();
            write!(f, " in {}", summarize(&names))?;
        }
        Ok(())
    }
}

impl fmt::Display for GraphStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} nodes, {} AsType", self.nodes, self.astype.len())?;
        for (op, n) in &self.by_op {
            writeln!(f, "  {op:<20} {n}")?;
        }
        // AsType grouped by (origin, source, from → to), most frequent first.
        let mut groups: BTreeMap<GroupKey, (usize, Vec<String>)> = BTreeMap::new();
        for a in &self.astype {
            let g = groups.entry((a.origin, a.source_op, a.from, a.to)).or_default();
            g.0 += 1;
            if let Some(l) = a.layer {
                g.1.push(format!("L{l}"));
            }
        }
        let mut groups: Vec<_> = groups.into_iter().collect();
        groups.sort_by_key(|g| std::cmp::Reverse(g.1 .0));
        for ((origin, source, from, to), (n, layers)) in groups {
            let at = if layers.is_empty() {
                String::new()
            } else {
                format!(" in {}", summarize(&layers))
            };
            writeln!(f, "  astype {from} → {to}: {n}× for {origin} (of {source}){at}")?;
        }
        Ok(())
    }
}

/// (origin, source op, from, to)
type GroupKey = (&'static str, &'static str, DType, DType);

fn summarize(layers: &[String]) -> String {
    if layers.len() <= 4 {
        layers.join(",")
    } else {
        format!("{},…,{} ({} layers)", layers[0], layers[layers.len() - 1], layers.len())
    }
}

fn color(d: DType) -> &'static str {
    match d {
        DType::F32 => "#9ecae1",
        DType::F16 => "#a1d99b",
        DType::BF16 => "#fdae6b",
        DType::I32 | DType::U32 | DType::U8 => "#d9d9d9",
        DType::Bool => "#bcbddc",
    }
}

/// The graph in Graphviz DOT: nodes coloured by dtype, `AsType` nodes red and doubled.
pub fn to_dot(graph: &Graph) -> String {
    let mut s =
        String::from("digraph mlxcel {\n  rankdir=TB;\n  node [shape=box, style=filled, fontname=\"monospace\"];\n");
    for (i, node) in graph.nodes.iter().enumerate() {
        let mut label = node.op.name().to_string();
        match &node.op {
            Op::Parameter { name, .. } | Op::Input { name } | Op::State { name } => write!(label, " {name}").unwrap(),
            _ => {}
        }
        if let Some(n) = &node.name {
            write!(label, "\\n{n}").unwrap();
        }
        write!(label, "\\n{} {:?}", node.dtype, node.shape).unwrap();
        let extra = if let Op::AsType = node.op {
            ", color=red, penwidth=3, peripheries=2"
        } else {
            ""
        };
        writeln!(
            s,
            "  n{i} [label=\"{label}\", fillcolor=\"{}\"{extra}];",
            color(node.dtype)
        )
        .unwrap();
        for input in &node.inputs {
            writeln!(s, "  n{} -> n{i};", input.0).unwrap();
        }
    }
    for (k, o) in graph.outputs.iter().enumerate() {
        writeln!(s, "  out{k} [label=\"output {k}\", shape=oval];\n  n{} -> out{k};", o.0).unwrap();
    }
    s.push_str("}\n");
    s
}
