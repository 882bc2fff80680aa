//! A graph is a list of nodes in topological order (every input precedes its user), plus the
//! nodes whose values a run returns.

use std::fmt;

use crate::dtype::DType;
use crate::op::Op;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Where a node sits in the model: a layer index (none for embedding/head) and a name such as
/// `attn_norm` or `q_proj`. Named nodes can be dumped after a run and diffed against a reference.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NodeName {
    pub layer: Option<u32>,
    pub name: String,
}

impl fmt::Display for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.layer {
            Some(l) => write!(f, "{}.{l}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Node {
    pub op: Op,
    pub inputs: Vec<NodeId>,
    pub shape: Vec<usize>,
    pub dtype: DType,
    /// Layer the builder was in when it made this node.
    pub layer: Option<u32>,
    /// Set by [`crate::GraphBuilder::name`].
    pub name: Option<NodeName>,
    /// The builder call that made the node: for an `AsType`, the op whose operand it converts
    /// (`"add"`, `"kv_write"`, `"astype"` for an explicit cast).
    pub origin: &'static str,
}

#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub nodes: Vec<Node>,
    /// Values returned by a run, in order.
    pub outputs: Vec<NodeId>,
}

impl Graph {
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    pub fn ids(&self) -> impl Iterator<Item = NodeId> {
        (0..self.nodes.len() as u32).map(NodeId)
    }

    /// Runtime inputs in node order; a run takes its inputs in this order.
    pub fn inputs(&self) -> Vec<NodeId> {
        self.ids()
            .filter(|&id| matches!(self.node(id).op, Op::Input { .. }))
            .collect()
    }

    pub fn input_names(&self) -> Vec<&str> {
        self.inputs()
            .into_iter()
            .map(|id| match &self.node(id).op {
                Op::Input { name } => name.as_str(),
                _ => unreachable!("inputs() returns input nodes"),
            })
            .collect()
    }

    /// Persistent state nodes (KV caches) in node order.
    pub fn states(&self) -> Vec<NodeId> {
        self.ids()
            .filter(|&id| matches!(self.node(id).op, Op::State { .. }))
            .collect()
    }

    /// For each node, the index of the last node that reads it (itself if none does); graph
    /// outputs live to the end.
    pub fn last_uses(&self) -> Vec<usize> {
        let mut last: Vec<usize> = (0..self.nodes.len()).collect();
        for (i, node) in self.nodes.iter().enumerate() {
            for &input in &node.inputs {
                last[input.index()] = last[input.index()].max(i);
            }
        }
        for &out in &self.outputs {
            last[out.index()] = usize::MAX;
        }
        last
    }

    /// Checks the invariants passes and backends rely on.
    pub fn validate(&self) -> crate::Result<()> {
        for (i, node) in self.nodes.iter().enumerate() {
            if let Some(bad) = node.inputs.iter().find(|input| input.index() >= i) {
                return Err(crate::Error::Invalid(format!(
                    "node {i} ({}) reads node {} which does not precede it",
                    node.op.name(),
                    bad.0
                )));
            }
        }
        if let Some(bad) = self.outputs.iter().find(|o| o.index() >= self.nodes.len()) {
            return Err(crate::Error::Invalid(format!("output {} is not a node", bad.0)));
        }
        Ok(())
    }
}
