//! Kernel fusion inside the CUDA backend: patterns of the decode graph that one kernel computes
//! in a single pass, found when a graph is loaded. The IR keeps the plain ops (so every backend
//! and the reference agree on meaning); the fused kernels round each intermediate to the dtype
//! the plain graph stores it in, so results match the unfused kernels.
//!
//! - `silu(x·Gᵀ) · (x·Uᵀ)` (the gated MLP's gate, up, SiLU and product): one GEMV reading x once;
//! - `rms_norm(a + b)` where the sum is also the residual stream: one kernel writing both.
//!
//! A fused kernel runs at the position of the pattern's last node (the anchor) and reads the
//! pattern's outer inputs there, so the planner must keep those alive until the anchor: the
//! graph it plans gets them as extra inputs of the anchor ([`Fusion::planning_graph`]).

use mlxcel_core::{BinaryOp, DType, Graph, NodeId, Op, UnaryOp};

use super::launch::GEMV_ROWS;

#[derive(Clone, Debug)]
pub enum Fused {
    /// Anchor = the product; `g`/`u` the gate and up matrix products over the same `x`.
    Glu { x: NodeId, g: usize, u: usize, silu: usize },
    /// Anchor = the norm; `add` is the residual sum it normalizes (also written).
    AddRmsNorm { add: usize },
}

pub struct Fusion {
    /// Per node: the fused kernel it anchors.
    pub anchored: Vec<Option<Fused>>,
    /// Per node: computed inside a later fused kernel, so not launched on its own.
    pub absorbed: Vec<bool>,
}

impl Fusion {
    pub fn none(n: usize) -> Fusion {
        Fusion {
            anchored: vec![None; n],
            absorbed: vec![false; n],
        }
    }

    /// Finds the patterns; `MLXCEL_CUDA_FUSE=0` turns fusion off.
    pub fn find(graph: &Graph) -> Fusion {
        let n = graph.nodes.len();
        let mut f = Fusion::none(n);
        if std::env::var("MLXCEL_CUDA_FUSE").is_ok_and(|v| v == "0") {
            return f;
        }
        let mut consumers = vec![Vec::new(); n];
        for (i, node) in graph.nodes.iter().enumerate() {
            for input in &node.inputs {
                consumers[input.index()].push(i);
            }
        }
        for &o in &graph.outputs {
            consumers[o.index()].push(usize::MAX);
        }
        let only_for = |v: usize, user: usize| consumers[v] == [user];
        for (i, node) in graph.nodes.iter().enumerate() {
            match &node.op {
                Op::Binary(BinaryOp::Mul) => {
                    let (a, b) = (node.inputs[0].index(), node.inputs[1].index());
                    let glu = |silu: usize, u: usize| -> Option<Fused> {
                        let Op::Unary(UnaryOp::Silu) = graph.nodes[silu].op else {
                            return None;
                        };
                        let g = graph.nodes[silu].inputs[0].index();
                        let ok = only_for(silu, i)
                            && only_for(u, i)
                            && only_for(g, silu)
                            && glu_pair(graph, g, u)
                            && !f.absorbed[g]
                            && !f.absorbed[u];
                        ok.then(|| Fused::Glu {
                            x: graph.nodes[g].inputs[0],
                            g,
                            u,
                            silu,
                        })
                    };
                    if let Some(fused) = glu(a, b).or_else(|| glu(b, a)) {
                        if let Fused::Glu { g, u, silu, .. } = fused {
                            f.absorbed[g] = true;
                            f.absorbed[u] = true;
                            f.absorbed[silu] = true;
                        }
                        f.anchored[i] = Some(fused);
                    }
                }
                Op::RmsNorm { .. } => {
                    let add = node.inputs[0].index();
                    let sum = &graph.nodes[add];
                    let ok = matches!(sum.op, Op::Binary(BinaryOp::Add))
                        && sum.dtype.is_float()
                        && !f.absorbed[add]
                        && f.anchored[add].is_none()
                        // Nothing may read the sum before the norm writes it.
                        && consumers[add].iter().all(|&c| c >= i);
                    if ok {
                        f.absorbed[add] = true;
                        f.anchored[i] = Some(Fused::AddRmsNorm { add });
                    }
                }
                _ => {}
            }
        }
        f
    }

    /// `graph` with each anchor also reading its pattern's outer inputs: what the planner sees,
    /// so those stay alive (and apart from the anchor's output) until the anchor runs.
    pub fn planning_graph(&self, graph: &Graph) -> Graph {
        let mut g = graph.clone();
        for (i, fused) in self.anchored.iter().enumerate() {
            let extra: Vec<NodeId> = match fused {
                None => continue,
                Some(Fused::Glu { x, .. }) => vec![*x],
                Some(Fused::AddRmsNorm { add }) => graph.nodes[*add].inputs.clone(),
            };
            g.nodes[i].inputs.extend(extra);
        }
        g
    }
}

/// Gate and up products the GLU kernels take: same x, same weight shape and format, few rows.
fn glu_pair(graph: &Graph, g: usize, u: usize) -> bool {
    let (ng, nu) = (&graph.nodes[g], &graph.nodes[u]);
    if ng.inputs[0] != nu.inputs[0] || ng.dtype != nu.dtype || ng.shape != nu.shape {
        return false;
    }
    let x = graph.node(ng.inputs[0]);
    let k = *x.shape.last().unwrap_or(&0);
    let rows = x.shape.iter().product::<usize>() / k.max(1);
    let same = |a: usize, b: usize| {
        let (a, b) = (graph.node(ng.inputs[a]), graph.node(nu.inputs[b]));
        a.dtype == b.dtype && a.shape == b.shape
    };
    if rows == 0 || rows > GEMV_ROWS || !x.dtype.is_float() {
        return false;
    }
    match (&ng.op, &nu.op) {
        (
            Op::QuantizedMatMul { bits, group_size },
            Op::QuantizedMatMul {
                bits: bu,
                group_size: gu,
            },
        ) => {
            bits == bu
                && group_size == gu
                && matches!(bits, 4 | 8)
                && group_size % 32 == 0
                && k.is_multiple_of(*group_size)
                && (1..4).all(|j| same(j, j))
                && graph.node(ng.inputs[2]).dtype == graph.node(ng.inputs[3]).dtype
        }
        (Op::MatMul { transpose_b: true }, Op::MatMul { transpose_b: true }) => {
            let w = graph.node(ng.inputs[1]);
            same(1, 1) && w.shape.len() == 2 && k.is_multiple_of(8) && matches!(w.dtype, DType::F16 | DType::BF16)
        }
        _ => false,
    }
}
