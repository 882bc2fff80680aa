//! The interface every backend implements: check support, plan a graph once, run it many
//! times. Persistent state (the KV cache) belongs to a session and is shared by name between
//! the graphs loaded into it (prefill and decode).

use crate::error::{Error, Result};
use crate::graph::{Graph, Node, NodeName};
use crate::tensor::HostTensor;

#[derive(Clone, Copy, Debug, Default)]
pub struct CompileOptions {
    /// Keep every named node's value so [`Session::named_values`] can return it.
    pub keep_named: bool,
}

/// Handle of a graph loaded into a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GraphId(pub usize);

/// Bytes a session holds, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryReport {
    /// Activation buffers of all loaded graphs (planned once each).
    pub planned_bytes: usize,
    /// Persistent states (KV caches).
    pub state_bytes: usize,
    /// Weight copies the backend made (0 when it reads the host tensors in place).
    pub parameter_bytes: usize,
}

pub trait Backend {
    fn name(&self) -> &'static str;
    /// Whether a kernel exists for this node (op and dtypes); the error names what is missing.
    fn check_supported(&self, node: &Node) -> Result<()>;
    fn new_session(&self) -> Result<Box<dyn Session>>;
    /// Memory copy bandwidth in bytes per second, counting every byte read and every byte
    /// written (as CUDA's bandwidthTest does): the ceiling `mlxcel bench` holds a memory-bound
    /// decode step against. The backend copies a buffer well past its caches, best of a few.
    fn copy_bandwidth(&self) -> Result<f64> {
        Err(Error::Unsupported {
            backend: self.name(),
            op: "copy bandwidth measurement".into(),
        })
    }
    /// Bytes in use on the whole device as its driver reports them (every process and context),
    /// or None where the backend has no device memory of its own.
    fn device_memory_used(&self) -> Result<Option<usize>> {
        Ok(None)
    }
}

pub trait Session: Send {
    fn backend_name(&self) -> &'static str;
    /// Plans `graph`'s memory and prepares it to run. States it names are created (zeroed) or,
    /// if an earlier graph made them, shared (their dtype and shape must agree).
    fn load(&mut self, graph: &Graph, options: CompileOptions) -> Result<GraphId>;
    /// Runs a loaded graph with its inputs in [`Graph::inputs`] order; returns its outputs.
    fn run(&mut self, id: GraphId, inputs: &[HostTensor]) -> Result<Vec<HostTensor>>;
    /// Values of the named nodes from the last run of `id` (loaded with `keep_named`).
    fn named_values(&self, id: GraphId) -> Result<Vec<(NodeName, HostTensor)>>;
    fn read_state(&self, name: &str) -> Result<HostTensor>;
    fn write_state(&mut self, name: &str, value: &HostTensor) -> Result<()>;
    fn memory(&self) -> MemoryReport;
    /// Frees a loaded graph's planned buffers (states, which other graphs may share, and the
    /// uploaded parameters stay). Its id is not reused; running it again is an error.
    fn unload(&mut self, id: GraphId) -> Result<()>;
}

/// Fails with the first node `backend` has no kernel for.
pub fn check_graph(backend: &dyn Backend, graph: &Graph) -> Result<()> {
    graph.nodes.iter().try_for_each(|n| backend.check_supported(n))
}

/// Checks run inputs against the graph's input nodes.
pub fn check_inputs(graph: &Graph, inputs: &[HostTensor]) -> Result<()> {
    let ids = graph.inputs();
    if ids.len() != inputs.len() {
        return Err(Error::Runtime(format!(
            "graph takes {} inputs ({}), got {}",
            ids.len(),
            graph.input_names().join(", "),
            inputs.len()
        )));
    }
    for ((id, t), name) in ids.iter().zip(inputs).zip(graph.input_names()) {
        let node = graph.node(*id);
        if node.dtype != t.dtype || node.shape != t.shape {
            return Err(Error::Runtime(format!(
                "input {name}: expected {} {:?}, got {} {:?}",
                node.dtype, node.shape, t.dtype, t.shape
            )));
        }
    }
    Ok(())
}

/// A session's persistent states (KV caches) by name, with whatever buffer type `B` the
/// backend keeps them in. Graphs loaded into one session share a state by naming it.
pub struct StateTable<B> {
    entries: Vec<StateEntry<B>>,
}

pub struct StateEntry<B> {
    pub name: String,
    pub dtype: crate::DType,
    pub shape: Vec<usize>,
    pub buf: B,
}

impl<B> Default for StateTable<B> {
    fn default() -> Self {
        StateTable { entries: Vec::new() }
    }
}

impl<B> StateTable<B> {
    /// The index of `node`'s state, made with `alloc(bytes)` if no graph declared it yet; a
    /// state declared again must have the same dtype and shape.
    pub fn declare(&mut self, node: &Node, alloc: impl FnOnce(usize) -> Result<B>) -> Result<usize> {
        let crate::Op::State { name } = &node.op else {
            return Err(Error::Invalid(format!("{} is not a state node", node.op.name())));
        };
        if let Some(i) = self.entries.iter().position(|s| &s.name == name) {
            let s = &self.entries[i];
            if s.dtype != node.dtype || s.shape != node.shape {
                return Err(Error::Invalid(format!(
                    "state {name} is {} {:?} in this session, the graph wants {} {:?}",
                    s.dtype, s.shape, node.dtype, node.shape
                )));
            }
            return Ok(i);
        }
        let bytes = node.shape.iter().product::<usize>() * node.dtype.size();
        let buf = alloc(bytes)?;
        self.entries.push(StateEntry {
            name: name.clone(),
            dtype: node.dtype,
            shape: node.shape.clone(),
            buf,
        });
        Ok(self.entries.len() - 1)
    }

    pub fn index(&self, name: &str) -> Result<usize> {
        self.entries
            .iter()
            .position(|s| s.name == name)
            .ok_or_else(|| Error::Invalid(format!("no state named {name} in this session")))
    }

    /// The state `name`, checked to fit `value` (for `write_state`).
    pub fn for_write(&mut self, name: &str, value: &HostTensor) -> Result<&mut StateEntry<B>> {
        let i = self.index(name)?;
        let s = &mut self.entries[i];
        if s.dtype != value.dtype || s.shape != value.shape {
            return Err(Error::Invalid(format!(
                "state {name} is {} {:?}, got {} {:?}",
                s.dtype, s.shape, value.dtype, value.shape
            )));
        }
        Ok(s)
    }

    pub fn get(&self, i: usize) -> &StateEntry<B> {
        &self.entries[i]
    }

    pub fn get_mut(&mut self, i: usize) -> &mut StateEntry<B> {
        &mut self.entries[i]
    }

    pub fn iter(&self) -> impl Iterator<Item = &StateEntry<B>> {
        self.entries.iter()
    }
}
