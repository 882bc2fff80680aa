//! The CPU backend: plain, readable kernels with f32 accumulation, used as the numerical
//! oracle for every other backend. A session owns the states (KV caches) and the planned
//! graphs; each graph's activation buffers are allocated once at load and reused every run.

mod bandwidth;
mod buffer;
mod exec;
mod kernels;

use mlxcel_core::backend::{check_inputs, CompileOptions, GraphId, MemoryReport, StateTable};
use mlxcel_core::{Backend, Error, Graph, HostTensor, Node, NodeName, Op, Result, Session};

use buffer::AlignedBuf;
use mlxcel_core::plan::{self, Loc, Plan};

pub struct CpuBackend;

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn check_supported(&self, node: &Node) -> Result<()> {
        exec::check_supported(node)
    }

    fn new_session(&self) -> Result<Box<dyn Session>> {
        Ok(Box::new(CpuSession::default()))
    }

    fn copy_bandwidth(&self) -> Result<f64> {
        Ok(bandwidth::copy_bandwidth(bandwidth::COPY_BYTES))
    }
}

type States = StateTable<AlignedBuf>;

/// A parameter or constant: read in place when its bytes are aligned, else copied once.
enum Leaf {
    Host(HostTensor),
    Copied(AlignedBuf),
}

impl Leaf {
    fn new(data: &HostTensor) -> Leaf {
        if (data.bytes().as_ptr() as usize).is_multiple_of(data.dtype.size()) {
            Leaf::Host(data.clone())
        } else {
            Leaf::Copied(AlignedBuf::from_bytes(data.bytes()))
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Leaf::Host(t) => t.bytes(),
            Leaf::Copied(b) => b.bytes(),
        }
    }
}

struct Loaded {
    graph: Graph,
    plan: Plan,
    leaves: Vec<Leaf>,
    slots: Vec<AlignedBuf>,
    keep_named: bool,
}

#[derive(Default)]
pub struct CpuSession {
    states: States,
    /// By id; None once unloaded.
    graphs: Vec<Option<Loaded>>,
}

impl CpuSession {
    fn loaded(&self, id: GraphId) -> Result<&Loaded> {
        self.graphs
            .get(id.0)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::Invalid(format!("no graph {} in this session", id.0)))
    }
}

fn read_loc<'a>(loc: Loc, leaves: &'a [Leaf], slots: &'a [AlignedBuf], states: &'a States) -> &'a [u8] {
    match loc {
        Loc::Leaf(i) => leaves[i].bytes(),
        Loc::Slot(i) => slots[i].bytes(),
        Loc::State(i) => states.get(i).buf.bytes(),
    }
}

fn value_bytes(node: &Node) -> usize {
    node.shape.iter().product::<usize>() * node.dtype.size()
}

impl Session for CpuSession {
    fn backend_name(&self) -> &'static str {
        "cpu"
    }

    fn load(&mut self, graph: &Graph, options: CompileOptions) -> Result<GraphId> {
        graph.validate()?;
        mlxcel_core::backend::check_graph(&CpuBackend, graph)?;
        let mut state_of = vec![0; graph.nodes.len()];
        let mut leaf_of = vec![0; graph.nodes.len()];
        let mut leaves = Vec::new();
        for (i, node) in graph.nodes.iter().enumerate() {
            match &node.op {
                Op::State { .. } => state_of[i] = self.states.declare(node, |bytes| Ok(AlignedBuf::zeroed(bytes)))?,
                Op::Parameter { data, .. } | Op::Constant { data } => {
                    leaf_of[i] = leaves.len();
                    leaves.push(Leaf::new(data));
                }
                _ => {}
            }
        }
        let plan = plan::plan(graph, options.keep_named, |i| state_of[i], |i| leaf_of[i]);
        let slots = plan.slot_bytes.iter().map(|&b| AlignedBuf::zeroed(b)).collect();
        self.graphs.push(Some(Loaded {
            graph: graph.clone(),
            plan,
            leaves,
            slots,
            keep_named: options.keep_named,
        }));
        Ok(GraphId(self.graphs.len() - 1))
    }

    fn run(&mut self, id: GraphId, inputs: &[HostTensor]) -> Result<Vec<HostTensor>> {
        let states = &mut self.states;
        let g = self
            .graphs
            .get_mut(id.0)
            .and_then(Option::as_mut)
            .ok_or_else(|| Error::Invalid(format!("no graph {} in this session", id.0)))?;
        check_inputs(&g.graph, inputs)?;
        let mut next_input = 0;
        for (i, node) in g.graph.nodes.iter().enumerate() {
            let loc = g.plan.locs[i];
            match node.op {
                Op::Parameter { .. } | Op::Constant { .. } | Op::State { .. } | Op::Reshape => continue,
                Op::Input { .. } => {
                    let Loc::Slot(s) = loc else {
                        unreachable!("inputs are planned into slots")
                    };
                    g.slots[s].bytes_mut()[..value_bytes(node)].copy_from_slice(inputs[next_input].bytes());
                    next_input += 1;
                    continue;
                }
                _ => {}
            }
            // Take the output buffer out so inputs can be borrowed beside it.
            let mut out = match loc {
                Loc::Slot(s) => std::mem::take(&mut g.slots[s]),
                Loc::State(s) => std::mem::take(&mut states.get_mut(s).buf),
                Loc::Leaf(_) => unreachable!("only leaves live in leaf locations"),
            };
            let result = {
                let ins: Vec<&[u8]> = node
                    .inputs
                    .iter()
                    .map(|&x| {
                        let n = value_bytes(g.graph.node(x));
                        let l = g.plan.locs[x.index()];
                        if l == loc {
                            &[][..] // the cache a KvWrite updates in place
                        } else {
                            &read_loc(l, &g.leaves, &g.slots, states)[..n]
                        }
                    })
                    .collect();
                let n = value_bytes(node);
                exec::execute(&g.graph, i, &ins, &mut out.bytes_mut()[..n])
            };
            match loc {
                Loc::Slot(s) => g.slots[s] = out,
                Loc::State(s) => states.get_mut(s).buf = out,
                Loc::Leaf(_) => unreachable!(),
            }
            result.map_err(|e| match e {
                Error::Runtime(msg) => Error::Runtime(format!("{} (node {i}): {msg}", node.op.name())),
                other => other,
            })?;
        }
        Ok(g.graph
            .outputs
            .iter()
            .map(|&o| snapshot(g, states, o.index()))
            .collect())
    }

    fn named_values(&self, id: GraphId) -> Result<Vec<(NodeName, HostTensor)>> {
        let g = self.loaded(id)?;
        if !g.keep_named {
            return Err(Error::Invalid("graph was loaded without keep_named".into()));
        }
        Ok(g.graph
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.name.clone().map(|name| (name, snapshot(g, &self.states, i))))
            .collect())
    }

    fn read_state(&self, name: &str) -> Result<HostTensor> {
        let s = self.states.get(self.states.index(name)?);
        HostTensor::from_bytes(
            s.dtype,
            s.shape.clone(),
            mlxcel_core::tensor::Storage::from_vec(s.buf.bytes().to_vec()),
        )
    }

    fn write_state(&mut self, name: &str, value: &HostTensor) -> Result<()> {
        self.states
            .for_write(name, value)?
            .buf
            .bytes_mut()
            .copy_from_slice(value.bytes());
        Ok(())
    }

    fn memory(&self) -> MemoryReport {
        let copied = |l: &Leaf| if let Leaf::Copied(b) = l { b.capacity() } else { 0 };
        MemoryReport {
            planned_bytes: self
                .graphs
                .iter()
                .flatten()
                .flat_map(|g| g.slots.iter().map(|s| s.capacity()))
                .sum(),
            state_bytes: self.states.iter().map(|s| s.buf.capacity()).sum(),
            parameter_bytes: self
                .graphs
                .iter()
                .flatten()
                .flat_map(|g| g.leaves.iter().map(copied))
                .sum(),
        }
    }

    fn unload(&mut self, id: GraphId) -> Result<()> {
        self.loaded(id)?;
        self.graphs[id.0] = None;
        Ok(())
    }
}

/// A host copy of node `i`'s current value.
fn snapshot(g: &Loaded, states: &States, i: usize) -> HostTensor {
    let node = &g.graph.nodes[i];
    let bytes = read_loc(g.plan.locs[i], &g.leaves, &g.slots, states)[..value_bytes(node)].to_vec();
    HostTensor::from_bytes(
        node.dtype,
        node.shape.clone(),
        mlxcel_core::tensor::Storage::from_vec(bytes),
    )
    .expect("planned buffers hold the value's bytes")
}
