//! `MLXCEL_CUDA_PROFILE=1`: every kernel of every run is bracketed by CUDA events (runs stay
//! eager, so the times include no graph replay) and summed per graph and kernel family; the
//! session prints the table on stderr when it is dropped. The families name the op and, for
//! matrix products, the matrix shape, so the slow projection shows by name.

use std::collections::HashMap;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::CudaEvent;
use mlxcel_core::{Graph, Op, Result};

use super::fuse::Fused;
use super::{driver_err, Gpu};

#[derive(Default)]
struct GraphTimes {
    runs: usize,
    kernels: usize,
    /// family → (launches, milliseconds)
    families: HashMap<String, (usize, f64)>,
}

pub struct Profiler {
    events: Vec<CudaEvent>,
    /// Family of each bracketed launch of the current run.
    pending: Vec<String>,
    graphs: HashMap<usize, GraphTimes>,
}

impl Profiler {
    pub fn from_env() -> Option<Profiler> {
        match std::env::var("MLXCEL_CUDA_PROFILE") {
            Ok(v) if !v.is_empty() && v != "0" => Some(Profiler {
                events: Vec::new(),
                pending: Vec::new(),
                graphs: HashMap::new(),
            }),
            _ => None,
        }
    }

    fn event(&mut self, gpu: &Gpu, k: usize) -> Result<&CudaEvent> {
        while self.events.len() <= k {
            let e = gpu
                .stream
                .context()
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(driver_err)?;
            self.events.push(e);
        }
        Ok(&self.events[k])
    }

    pub fn before(&mut self, gpu: &Gpu, family: String) -> Result<()> {
        let k = 2 * self.pending.len();
        self.pending.push(family);
        self.event(gpu, k)?.record(&gpu.stream).map_err(driver_err)
    }

    pub fn after(&mut self, gpu: &Gpu) -> Result<()> {
        let k = 2 * self.pending.len() - 1;
        self.event(gpu, k)?.record(&gpu.stream).map_err(driver_err)
    }

    pub fn finish_run(&mut self, gpu: &Gpu, graph: usize) -> Result<()> {
        gpu.stream.synchronize().map_err(driver_err)?;
        let t = self.graphs.entry(graph).or_default();
        t.runs += 1;
        t.kernels = self.pending.len();
        for (j, fam) in self.pending.drain(..).enumerate() {
            let ms = self.events[2 * j]
                .elapsed_ms(&self.events[2 * j + 1])
                .map_err(driver_err)? as f64;
            let e = t.families.entry(fam).or_default();
            e.0 += 1;
            e.1 += ms;
        }
        Ok(())
    }

    /// The table printed at the end: per graph that ran, time per run by family.
    pub fn report(&self) -> String {
        let mut out = String::new();
        let mut ids: Vec<_> = self.graphs.keys().copied().collect();
        ids.sort();
        for id in ids {
            let t = &self.graphs[&id];
            let total: f64 = t.families.values().map(|f| f.1).sum();
            out += &format!(
                "mlxcel cuda profile: graph {id}: {} kernels, {} runs, {:.3} ms of kernels per run\n",
                t.kernels,
                t.runs,
                total / t.runs as f64
            );
            let mut fams: Vec<_> = t.families.iter().collect();
            fams.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
            for (name, (calls, ms)) in fams {
                out += &format!(
                    "  {:>9.1} us/run {:>5.1}%  {:>5} launches/run  {name}\n",
                    1000.0 * ms / t.runs as f64,
                    100.0 * ms / total.max(1e-12),
                    calls / t.runs
                );
            }
        }
        out
    }
}

/// The label of what a GEMV computes its input from: the add + RMSNorm, and a sandwich norm
/// before the add.
fn normed(norm: &Option<super::fuse::NormIn>) -> &'static str {
    match norm {
        Some(n) if n.pre.is_some() => "rms_norm+add+rms_norm+",
        Some(_) => "add+rms_norm+",
        None => "",
    }
}

/// Op name, plus `[rows x cols]` of the weight for matrix products.
pub fn family(graph: &Graph, i: usize, fused: Option<&Fused>) -> String {
    let node = &graph.nodes[i];
    match fused {
        Some(Fused::Glu { g, norm, route, .. }) => {
            let pre = if route.is_some() { "moe router+" } else { normed(norm) };
            return format!("fused {pre}gate·up+act·mul ({})", family(graph, *g, None));
        }
        Some(Fused::AddRmsNorm { .. }) => return format!("fused add+rms_norm {}", node.dtype),
        Some(Fused::RopeKvWrite { .. }) => return format!("fused rope+kv_write {}", node.dtype),
        Some(Fused::WeightedSum { .. }) => return format!("fused moe combine {}", node.dtype),
        Some(Fused::Router { .. }) => return format!("fused moe router {}", node.dtype),
        Some(Fused::ActMul { .. }) => return format!("fused act·mul {}", node.dtype),
        Some(Fused::HeadsLastAttention { attn }) => return format!("{} (heads last)", family(graph, *attn, None)),
        Some(Fused::RopeQkvWrite { norms, .. }) => {
            let normed = if norms.is_some() { "norm+" } else { "" };
            return format!(
                "fused {normed}rope q, {normed}rope+kv_write k, kv_write v {}",
                node.dtype
            );
        }
        Some(Fused::RopeAttention { .. }) => return format!("{} (rope and kv_write in)", family(graph, i, None)),
        Some(Fused::Products {
            parts,
            biases,
            norm,
            rope,
            qk_norms,
        }) => {
            let pre = normed(norm);
            let bias = if biases.is_empty() { "" } else { "+bias" };
            let post = match (rope.is_some(), qk_norms.is_some()) {
                (false, _) => "",
                (true, false) => "+rope+kv_write",
                (true, true) => "+qk_norm+rope+kv_write",
            };
            let last = *parts.last().expect("fused products have parts");
            return format!(
                "fused {pre}{} products{bias}{post} ({})",
                parts.len(),
                family(graph, last, None)
            );
        }
        None => {}
    }
    let input = |k: usize| &graph.node(node.inputs[k]).shape;
    match &node.op {
        Op::QuantizedMatMul { bits, .. } => {
            let m: usize = node.shape[..node.shape.len() - 1].iter().product();
            let k = *input(0).last().unwrap_or(&0);
            format!("qmm{bits} m={m} [{} x {k}]", input(1)[0])
        }
        Op::MatMul { transpose_b } => {
            let (sa, sb) = (input(0), input(1));
            format!("matmul t={transpose_b} {:?} @ {:?}", sa, sb)
        }
        Op::Attention { .. } => format!("attention q{:?} k{:?}", input(0), input(1)),
        Op::PagedAttention { .. } => format!("paged attention q{:?} table{:?}", input(0), input(4)),
        op => format!("{} {}", op.name(), node.dtype),
    }
}
