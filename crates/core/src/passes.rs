//! Graph → graph rewrites. A pass has a name (for logs and statistics) and must keep results
//! bit-identical unless its documentation says otherwise.

use crate::dtype::DType;
use crate::error::Result;
use crate::graph::{Graph, Node, NodeId};
use crate::op::Op;
use crate::tensor::HostTensor;

pub struct Pass {
    pub name: &'static str,
    pub run: fn(&Graph) -> Result<Graph>,
}

/// The passes every graph goes through before a backend plans it, in order.
pub fn default_passes() -> Vec<Pass> {
    vec![
        Pass {
            name: "remove_noop_astype",
            run: remove_noop_astype,
        },
        Pass {
            name: "fold_constant_astype",
            run: fold_constant_astype,
        },
        Pass {
            name: "fold_constant_broadcast",
            run: fold_constant_broadcast,
        },
        Pass {
            name: "dedupe_constants",
            run: dedupe_constants,
        },
        Pass {
            name: "transpose_as_reshape",
            run: transpose_as_reshape,
        },
        Pass {
            name: "dead_node_elimination",
            run: dead_node_elimination,
        },
    ]
}

/// A transpose that only moves axes of length 1 keeps every element where it was (row-major),
/// so it becomes a reshape, which backends alias instead of copying. At decode (one position)
/// that is every `[1, T, H, D] ↔ [1, H, T, D]` swap around attention.
pub fn transpose_as_reshape(graph: &Graph) -> Result<Graph> {
    Ok(rewrite(graph, |g, _, node| {
        if let Op::Transpose { perm } = &node.op {
            let input = &g.node(node.inputs[0]).shape;
            let order: Vec<usize> = perm.iter().copied().filter(|&a| input[a] != 1).collect();
            if order.windows(2).all(|w| w[0] < w[1]) {
                let mut node = node.clone();
                node.op = Op::Reshape;
                return Action::Keep(node);
            }
        }
        Action::Keep(node.clone())
    }))
}

pub fn run_passes(graph: &Graph, passes: &[Pass]) -> Result<Graph> {
    let mut g = graph.clone();
    for pass in passes {
        g = (pass.run)(&g)?;
        g.validate()?;
    }
    Ok(g)
}

/// What a rewrite does with one node.
enum Action {
    Keep(Node),
    /// Use this (already rewritten) node wherever the old one was read.
    Forward(NodeId),
    Drop,
}

/// Rebuilds `graph` node by node; `f` sees each node with its inputs already remapped.
fn rewrite(graph: &Graph, mut f: impl FnMut(&Graph, usize, &Node) -> Action) -> Graph {
    let mut out = Graph::default();
    let mut map: Vec<Option<NodeId>> = Vec::with_capacity(graph.nodes.len());
    for (index, node) in graph.nodes.iter().enumerate() {
        let mut node = node.clone();
        let inputs: Option<Vec<NodeId>> = node.inputs.iter().map(|i| map[i.index()]).collect();
        let Some(inputs) = inputs else {
            map.push(None); // an input was dropped, so this node is dead too
            continue;
        };
        node.inputs = inputs;
        map.push(match f(&out, index, &node) {
            Action::Keep(node) => {
                out.nodes.push(node);
                Some(NodeId(out.nodes.len() as u32 - 1))
            }
            Action::Forward(id) => Some(id),
            Action::Drop => None,
        });
    }
    out.outputs = graph
        .outputs
        .iter()
        .map(|o| map[o.index()].expect("outputs are never dropped"))
        .collect();
    out
}

/// True when every value of `from` converts to `to` and back unchanged.
pub fn widens_exactly(from: DType, to: DType) -> bool {
    use DType::*;
    from == to
        || match from {
            Bool => true,
            U8 => matches!(to, U32 | I32 | F16 | BF16 | F32),
            F16 | BF16 => to == F32,
            U32 | I32 | F32 => false,
        }
}

/// Drops `AsType` to the dtype a value already has, and `x → wider → x` round trips.
pub fn remove_noop_astype(graph: &Graph) -> Result<Graph> {
    Ok(rewrite(graph, |g, _, node| {
        if !matches!(node.op, Op::AsType) {
            return Action::Keep(node.clone());
        }
        let src = g.node(node.inputs[0]);
        if src.dtype == node.dtype {
            return Action::Forward(node.inputs[0]);
        }
        if matches!(src.op, Op::AsType) {
            let orig = src.inputs[0];
            if g.node(orig).dtype == node.dtype && widens_exactly(node.dtype, src.dtype) {
                return Action::Forward(orig);
            }
        }
        Action::Keep(node.clone())
    }))
}

/// Replaces `AsType(constant)` with the converted constant, computed once here.
pub fn fold_constant_astype(graph: &Graph) -> Result<Graph> {
    Ok(rewrite(graph, |g, _, node| {
        if !matches!(node.op, Op::AsType) {
            return Action::Keep(node.clone());
        }
        let src = g.node(node.inputs[0]);
        let op = match &src.op {
            Op::Constant { data } => Op::Constant {
                data: data.convert(node.dtype),
            },
            Op::Parameter { name, data } => Op::Parameter {
                name: name.clone(),
                data: data.convert(node.dtype),
            },
            _ => return Action::Keep(node.clone()),
        };
        Action::Keep(Node {
            op,
            inputs: vec![],
            ..node.clone()
        })
    }))
}

/// Largest broadcast of a constant that [`fold_constant_broadcast`] materializes.
pub const FOLD_BROADCAST_BYTES: usize = 64 << 10;

/// Replaces `Broadcast(constant)` with the broadcast constant when it is small (at most
/// [`FOLD_BROADCAST_BYTES`]): made once here instead of by a kernel every step (the MoE
/// router's reversed expert ids, for one).
pub fn fold_constant_broadcast(graph: &Graph) -> Result<Graph> {
    let mut failed = None;
    let g = rewrite(graph, |g, _, node| {
        if !matches!(node.op, Op::Broadcast)
            || crate::tensor::numel(&node.shape) * node.dtype.size() > FOLD_BROADCAST_BYTES
        {
            return Action::Keep(node.clone());
        }
        // The builder reshapes a lower-rank operand to the output's rank first.
        let mut src = g.node(node.inputs[0]);
        while matches!(src.op, Op::Reshape) {
            src = g.node(src.inputs[0]);
        }
        let Op::Constant { data } = &src.op else {
            return Action::Keep(node.clone());
        };
        let from = &g.node(node.inputs[0]).shape;
        let data = HostTensor::from_bytes(data.dtype, from.clone(), data.data.clone())
            .and_then(|d| d.broadcast_to(&node.shape));
        match data {
            Ok(data) => Action::Keep(Node {
                op: Op::Constant { data },
                inputs: vec![],
                ..node.clone()
            }),
            Err(e) => {
                failed = Some(e);
                Action::Keep(node.clone())
            }
        }
    });
    match failed {
        Some(e) => Err(e),
        None => Ok(g),
    }
}

/// Makes unnamed constants of the same dtype, shape and bytes one node (each RoPE call builds
/// its own frequency table, for one): stored and uploaded once, and fusions that want the same
/// value see the same node.
pub fn dedupe_constants(graph: &Graph) -> Result<Graph> {
    use std::collections::HashMap;
    let mut seen: HashMap<(DType, Vec<usize>, Vec<u8>), NodeId> = HashMap::new();
    Ok(rewrite(graph, |g, _, node| {
        let Op::Constant { data } = &node.op else {
            return Action::Keep(node.clone());
        };
        if node.name.is_some() {
            return Action::Keep(node.clone());
        }
        let key = (data.dtype, data.shape.clone(), data.bytes().to_vec());
        match seen.get(&key) {
            Some(&id) if g.node(id).shape == node.shape && g.node(id).dtype == node.dtype => Action::Forward(id),
            _ => {
                seen.insert(key, NodeId(g.nodes.len() as u32));
                Action::Keep(node.clone())
            }
        }
    }))
}

/// Removes nodes that no output depends on. Inputs and states stay: they are the graph's
/// interface, and side-effecting nodes (cache writes) stay with what they read.
pub fn dead_node_elimination(graph: &Graph) -> Result<Graph> {
    let mut live = vec![false; graph.nodes.len()];
    for o in &graph.outputs {
        live[o.index()] = true;
    }
    for (i, node) in graph.nodes.iter().enumerate() {
        if node.op.has_side_effect() || matches!(node.op, Op::Input { .. } | Op::State { .. }) {
            live[i] = true;
        }
    }
    for i in (0..graph.nodes.len()).rev() {
        if live[i] {
            for input in &graph.nodes[i].inputs {
                live[input.index()] = true;
            }
        }
    }
    Ok(rewrite(graph, |_, index, node| {
        if live[index] {
            Action::Keep(node.clone())
        } else {
            Action::Drop
        }
    }))
}
