//! Kernel fusion inside the CUDA backend: patterns of the decode graph that one kernel computes
//! in a single pass, found when a graph is loaded. The IR keeps the plain ops (so every backend
//! and the reference agree on meaning); the fused kernels round each intermediate to the dtype
//! the plain graph stores it in, so results match the unfused kernels.
//!
//! - `act(x·Gᵀ) · (x·Uᵀ)` with act SiLU or GELU (the gated MLP's gate, up, activation and
//!   product): one GEMV reading x once; also for routed experts' gathered products at decode;
//! - `rms_norm(a + b)` where the sum is also the residual stream: one kernel writing both;
//! - `kv_write(cache, rope(k))`: the keys rotated straight into the cache, and with the queries'
//!   rope and the values' cache write of the same attention, all three as one launch;
//! - a MoE router after its product (softmax, top-k, the chosen probabilities, their
//!   renormalization): one launch writing the ids and the weights;
//! - the routed experts' outputs times their router weights, summed over the experts;
//! - up to three one-row products of the same x (attention's q, k and v), 4-bit or dense 16-bit:
//!   one GEMV launch over all their rows (tensor cores for 4-bit), so the narrow k and v products
//!   share the GPU with q and a layer launches two kernels fewer; with each product's bias
//!   (Qwen2's q, k and v) added as the launch writes it;
//! - an attention's three 4-bit or dense products (q, k and v, batch 1 at one position) and
//!   the rope-and-write that reads them: one launch that writes the turned queries and both
//!   caches; for 4-bit products, with the per-head q and k norms between (Qwen3's, Gemma 3's;
//!   a head's tiles in a thread-block cluster);
//! - `rms_norm(a + b)` read only by one GEMV launch that stages x (fused products or GLU, 4-bit
//!   on tensor cores or dense 16-bit): the GEMV computes its input itself while staging it, and
//!   writes the sum, so the norm is no launch;
//! - opt-in (`MLXCEL_CUDA_FUSE_ROPE_ATTENTION=1`): a decode step's rope-and-write inside the
//!   split kernel of the attention that reads it.
//!
//! A fused kernel runs at the position of the pattern's last node (the anchor) and reads the
//! pattern's outer inputs there, so the planner must keep those alive until the anchor: the
//! graph it plans gets them as extra inputs of the anchor ([`Fusion::planning_graph`]).

use mlxcel_core::{BinaryOp, DType, Graph, NodeId, Op, ReduceOp, UnaryOp};

use super::launch::GEMV_ROWS;

#[derive(Clone, Debug)]
pub enum Fused {
    /// Anchor = the product; `g`/`u` the gate and up matrix products over the same `x`; `norm`
    /// the add + RMSNorm that makes x, computed by this launch (see [`NormIn`]); `route` the
    /// router that chose routed experts' ids, made by this launch too (see [`Route`]).
    Glu {
        x: NodeId,
        g: usize,
        u: usize,
        act: usize,
        norm: Option<NormIn>,
        route: Option<Route>,
    },
    /// Anchor = the product act(g) · u of two same-shaped tensors where no GEMV takes the gated
    /// MLP (a prefill's); `act` (absorbed) reads g, which only it reads.
    ActMul { act: usize, u: NodeId },
    /// Anchor = the norm; `add` is the residual sum it normalizes (also written).
    AddRmsNorm { add: usize },
    /// Products of the same x (`parts`, in graph order), written by one launch at the anchor:
    /// the last product, or with `biases` the last of those sums (biases[j] = parts[j] + a bias
    /// vector, the product's only reader; the launch writes the sums, and the products are
    /// never stored). Nothing reads what the launch writes before the anchor; `norm` as for
    /// `Glu`.
    /// With `rope` (the `RopeQkvWrite` q, k and v of the attention the three products feed, at
    /// one position), the anchor is that rope-and-write's and the launch writes the turned
    /// queries and both caches instead of the products ([`find_products_rope`]); `qk_norms`
    /// the per-head RMSNorms of q and k before their ropes (the rope-and-write's `norms`),
    /// which the launch applies too.
    Products {
        parts: Vec<usize>,
        biases: Vec<usize>,
        norm: Option<NormIn>,
        rope: Option<[usize; 3]>,
        qk_norms: Option<[usize; 2]>,
    },
    /// Anchor = the cache write; `rope` the rotation of the keys it writes (read by nothing else).
    RopeKvWrite { rope: usize },
    /// Anchor = the last of `q` (the queries' rope), `k` (the keys' cache write, its rope
    /// absorbed) and `v` (the values' cache write), which one attention reads: one launch.
    /// `heads_last`: the three read [B, T, H, D] → [B, H, T, D] transposes (a prefill's), which
    /// the launch absorbs too, reading their inputs.
    RopeQkvWrite {
        q: usize,
        k: usize,
        v: usize,
        heads_last: bool,
        /// The queries' and the keys' per-head RMSNorms (Qwen3's and Gemma 3's q_norm and
        /// k_norm), absorbed with the moves to [B, H, T, D] between them and the ropes: the
        /// launch reads the norms' inputs and normalizes each head itself.
        norms: Option<[usize; 2]>,
    },
    /// Anchor = a decode attention that reads a `RopeQkvWrite`'s three (q, k and v as there):
    /// its split kernel rotates the queries as it loads them and writes the new key and value
    /// into the caches itself, so the rope-and-write is no launch. Opt-in
    /// (`MLXCEL_CUDA_FUSE_ROPE_ATTENTION=1`): correct on the H100 but slower there, though its
    /// kernels sum to less (docs/benchmark_results/cuda-decode.md, session 11).
    RopeAttention { q: usize, k: usize, v: usize },
    /// Anchor = a [B, H, T, D] → [B, T, H, D] transpose of a prefill attention's output, the only
    /// reader of `attn`: the flash prefill kernel writes the transposed layout itself.
    HeadsLastAttention { attn: usize },
    /// Anchor = the router's weights: the take_along of `softmax`'s probabilities at `topk`'s
    /// ids, or (`renorm`) those divided by their sum; softmax, top-k, gather and sum in the
    /// anchor's launch, which writes the ids too.
    Router { softmax: usize, topk: usize, renorm: bool },
    /// Anchor = a sum over the middle axis of `mul` = y [.., k, d] · broadcast(w [.., k, 1])
    /// (MoE's combine of its experts' outputs with the router weights): one launch.
    WeightedSum { mul: usize, y: NodeId, w: NodeId },
}

/// A MoE router (a [`Fused::Router`] whose launch is absorbed, `anchor` its weights) made inside
/// the routed GLU that reads its ids: each block of the GLU routes its own (token, expert) pair
/// from the router's logits (the softmax's input), and the blocks of the first row tile write
/// the ids (`topk`'s output) and the weights (the anchor's) for the later readers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Route {
    pub anchor: usize,
    pub softmax: usize,
    pub topk: usize,
    pub renorm: bool,
}

/// x = rms_norm(a + b) computed inside the GEMV that reads it: `norm` the norm node (absorbed),
/// `add` the residual sum it normalizes (absorbed; the GEMV writes it); `pre` a norm that makes
/// one of the sum's operands and only it reads (absorbed: a sandwich norm, Gemma's
/// post-attention and post-feed-forward norms), which the GEMV computes too.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NormIn {
    pub norm: usize,
    pub add: usize,
    pub pre: Option<usize>,
}

impl NormIn {
    /// The sum's operands as the GEMV reads them: the other operand, then the pre-norm's input
    /// and weight where one normalizes the second; else both operands.
    pub fn reads(&self, graph: &Graph) -> Vec<NodeId> {
        let sum = &graph.nodes[self.add];
        match self.pre {
            Some(p) => {
                let other = sum.inputs.iter().copied().find(|v| v.index() != p);
                other.into_iter().chain(graph.nodes[p].inputs.iter().copied()).collect()
            }
            None => sum.inputs.clone(),
        }
    }
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

    /// Finds the patterns; `MLXCEL_CUDA_FUSE=0` turns fusion off, `MLXCEL_CUDA_FUSE_PRODUCTS=0`
    /// only the shared-x products, `MLXCEL_CUDA_FUSE_ROPE=0` only RoPE into the cache;
    /// `MLXCEL_CUDA_FUSE_ROPE_ATTENTION=1` folds decode rope and cache writes into the attention.
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
        let rope_fusion = !std::env::var("MLXCEL_CUDA_FUSE_ROPE").is_ok_and(|v| v == "0");
        for (i, node) in graph.nodes.iter().enumerate() {
            match &node.op {
                Op::Binary(BinaryOp::Mul) => {
                    let (a, b) = (node.inputs[0].index(), node.inputs[1].index());
                    let glu = |act: usize, u: usize| -> Option<Fused> {
                        let Op::Unary(UnaryOp::Silu | UnaryOp::GeluTanh | UnaryOp::GeluErf) = graph.nodes[act].op
                        else {
                            return None;
                        };
                        let g = graph.nodes[act].inputs[0].index();
                        let ok = only_for(act, i)
                            && only_for(u, i)
                            && only_for(g, act)
                            && glu_pair(graph, g, u)
                            && !f.absorbed[g]
                            && !f.absorbed[u];
                        ok.then(|| Fused::Glu {
                            x: graph.nodes[g].inputs[0],
                            g,
                            u,
                            act,
                            norm: None,
                            route: None,
                        })
                    };
                    if let Some(fused) = glu(a, b).or_else(|| glu(b, a)) {
                        if let Fused::Glu { g, u, act, .. } = fused {
                            f.absorbed[g] = true;
                            f.absorbed[u] = true;
                            f.absorbed[act] = true;
                        }
                        f.anchored[i] = Some(fused);
                        continue;
                    }
                    let act_mul = |act: usize, u: usize| -> Option<Fused> {
                        let na = &graph.nodes[act];
                        if !matches!(na.op, Op::Unary(UnaryOp::Silu | UnaryOp::GeluTanh | UnaryOp::GeluErf)) {
                            return None;
                        }
                        let same = [na.inputs[0].index(), u, i].iter().all(|&j| {
                            let n = &graph.nodes[j];
                            n.dtype == node.dtype && n.shape == node.shape
                        });
                        let ok = node.dtype.is_float()
                            && same
                            && only_for(act, i)
                            && !f.absorbed[act]
                            && f.anchored[act].is_none();
                        ok.then_some(Fused::ActMul {
                            act,
                            u: node.inputs[if u == a { 0 } else { 1 }],
                        })
                    };
                    if let Some(fused) = act_mul(a, b).or_else(|| act_mul(b, a)) {
                        if let Fused::ActMul { act, .. } = fused {
                            f.absorbed[act] = true;
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
                // Not for a slot a token (pos [B, T]): the fused kernels write runs.
                Op::KvWrite if rope_fusion && graph.node(node.inputs[2]).shape.len() <= 1 => {
                    let rope = node.inputs[1].index();
                    let r = &graph.nodes[rope];
                    let ok = matches!(r.op, Op::Rope { .. })
                        && r.dtype == node.dtype
                        && r.shape.len() == 4
                        && only_for(rope, i)
                        && !f.absorbed[rope]
                        && f.anchored[rope].is_none();
                    if ok {
                        f.absorbed[rope] = true;
                        f.anchored[i] = Some(Fused::RopeKvWrite { rope });
                    }
                }
                _ => {}
            }
        }
        find_rope_qkv(graph, &consumers, &mut f);
        find_heads_last_attention(graph, &consumers, &mut f);
        if !std::env::var("MLXCEL_CUDA_FUSE_ROUTER").is_ok_and(|v| v == "0") {
            find_routers(graph, &consumers, &mut f);
            find_weighted_sums(graph, &consumers, &mut f);
            if !std::env::var("MLXCEL_CUDA_FUSE_ROUTE_GLU").is_ok_and(|v| v == "0") {
                find_routed_glus(graph, &consumers, &mut f);
            }
        }
        if !std::env::var("MLXCEL_CUDA_FUSE_PRODUCTS").is_ok_and(|v| v == "0") {
            find_products(graph, &consumers, &mut f);
        }
        if !std::env::var("MLXCEL_CUDA_FUSE_NORM").is_ok_and(|v| v == "0") {
            find_normed_inputs(graph, &consumers, &mut f);
        }
        // Last: both take a rope-and-write the passes above left whole (its norms folded, its
        // products grouped and their input's norm folded); the products' launch first.
        if !std::env::var("MLXCEL_CUDA_FUSE_PRODUCTS_ROPE").is_ok_and(|v| v == "0") {
            find_products_rope(graph, &consumers, &mut f);
        }
        if rope_fusion && std::env::var("MLXCEL_CUDA_FUSE_ROPE_ATTENTION").is_ok_and(|v| v == "1") {
            find_rope_attention(graph, &consumers, &mut f);
        }
        f
    }

    /// `graph` with each anchor also reading its pattern's outer inputs: what the planner sees,
    /// so those stay alive (and apart from the anchor's output) until the anchor runs.
    pub fn planning_graph(&self, graph: &Graph) -> Graph {
        let mut g = graph.clone();
        for (i, fused) in self.anchored.iter().enumerate() {
            let (mut extra, norm): (Vec<NodeId>, _) = match fused {
                None => continue,
                // Routed experts also read their ids, or make them from the router's logits.
                Some(Fused::Glu { x, g, norm, route, .. }) => match (&graph.nodes[*g].op, route) {
                    (Op::GatherQuantizedMatMul { .. }, Some(r)) => (vec![*x, graph.nodes[r.softmax].inputs[0]], norm),
                    (Op::GatherQuantizedMatMul { .. }, None) => (vec![*x, graph.nodes[*g].inputs[4]], norm),
                    _ => (vec![*x], norm),
                },
                Some(Fused::AddRmsNorm { add }) => (graph.nodes[*add].inputs.clone(), &None),
                // The weights and biases are parameters.
                Some(Fused::Products {
                    parts,
                    norm,
                    rope,
                    qk_norms,
                    ..
                }) => {
                    let mut reads = vec![graph.nodes[parts[0]].inputs[0]];
                    if let Some([q, k, v]) = rope {
                        reads.extend(rope_qkv_reads(graph, *q, *k, *v, false));
                    }
                    // The norms' weights (their inputs are the products the launch computes).
                    for n in qk_norms.iter().flatten() {
                        reads.push(graph.nodes[*n].inputs[1]);
                    }
                    (reads, norm)
                }
                Some(Fused::RopeKvWrite { rope }) => (graph.nodes[*rope].inputs.clone(), &None),
                Some(Fused::Router { softmax, .. }) => (graph.nodes[*softmax].inputs.clone(), &None),
                Some(Fused::WeightedSum { y, w, .. }) => (vec![*y, *w], &None),
                Some(Fused::ActMul { act, .. }) => (vec![graph.nodes[*act].inputs[0]], &None),
                Some(Fused::HeadsLastAttention { attn }) => (graph.nodes[*attn].inputs.clone(), &None),
                Some(Fused::RopeQkvWrite {
                    q,
                    k,
                    v,
                    heads_last,
                    norms,
                }) => {
                    let mut reads = rope_qkv_reads(graph, *q, *k, *v, *heads_last);
                    // The norms' inputs and weights.
                    for n in norms.iter().flatten() {
                        reads.extend(graph.nodes[*n].inputs.iter().copied());
                    }
                    (reads, &None)
                }
                Some(Fused::RopeAttention { q, k, v }) => (rope_qkv_reads(graph, *q, *k, *v, false), &None),
            };
            // A GEMV computing its own input reads the sum's operands (or the pre-norm's input
            // and weight for one, NormIn::reads) and the norm's weight, and writes the sum,
            // whose buffer must stay its own until then even where only the norm read it.
            if let Some(n) = norm {
                extra.extend(n.reads(graph));
                extra.push(graph.nodes[n.norm].inputs[1]);
                extra.push(NodeId(n.add as u32));
            }
            g.nodes[i].inputs.extend(extra);
        }
        g
    }
}

/// What a rope-and-write of q, k and v reads: the three nodes' inputs and the keys' rope's
/// (with heads_last, also the inputs of the transposes it absorbs).
fn rope_qkv_reads(graph: &Graph, q: usize, k: usize, v: usize, heads_last: bool) -> Vec<NodeId> {
    let rope_k = graph.nodes[k].inputs[1].index();
    let mut reads: Vec<NodeId> = [q, rope_k, k, v]
        .into_iter()
        .flat_map(|j| graph.nodes[j].inputs.clone())
        .collect();
    if heads_last {
        for (j, slot) in [(q, 0), (rope_k, 0), (v, 1)] {
            reads.push(graph.node(graph.nodes[j].inputs[slot]).inputs[0]);
        }
    }
    reads
}

/// Folds each decode rope-and-write (`RopeQkvWrite`, not heads-last) into the attention that
/// reads its three, where that attention runs a split kernel with a rope variant
/// ([`super::launch::rope_attention_kernel`]) and nothing else reads the three before it.
fn find_rope_attention(graph: &Graph, consumers: &[Vec<usize>], f: &mut Fusion) {
    for a in 0..graph.nodes.len() {
        let node = &graph.nodes[a];
        if !matches!(node.op, Op::Attention { .. }) || f.absorbed[a] || f.anchored[a].is_some() {
            continue;
        }
        let (q, k, v) = (node.inputs[0].index(), node.inputs[1].index(), node.inputs[2].index());
        let anchor = q.max(k).max(v);
        let Some(Fused::RopeQkvWrite {
            heads_last: false,
            norms: None,
            ..
        }) = f.anchored[anchor]
        else {
            continue;
        };
        let same = matches!(f.anchored[anchor], Some(Fused::RopeQkvWrite { q: fq, k: fk, v: fv, .. }) if (fq, fk, fv) == (q, k, v));
        let unread = [q, k, v].iter().all(|&j| consumers[j].iter().all(|&c| c >= a));
        if same && unread && super::launch::rope_attention_kernel(graph, a).is_some() {
            f.anchored[anchor] = None;
            f.absorbed[anchor] = true;
            f.anchored[a] = Some(Fused::RopeAttention { q, k, v });
        }
    }
}

/// A transpose swapping the heads and positions axes of [B, ·, ·, D] (a prefill's attention
/// operands and output).
fn heads_swap(op: &Op) -> bool {
    matches!(op, Op::Transpose { perm } if perm[..] == [0, 2, 1, 3])
}

/// A prefill attention read only by the transpose back to [B, T, H, D] (before the output
/// projection) writes that layout itself, where the flash prefill kernel runs it.
fn find_heads_last_attention(graph: &Graph, consumers: &[Vec<usize>], f: &mut Fusion) {
    for (i, node) in graph.nodes.iter().enumerate() {
        if !heads_swap(&node.op) {
            continue;
        }
        let a = node.inputs[0].index();
        let ok = matches!(graph.nodes[a].op, Op::Attention { .. })
            && consumers[a] == [i]
            && !f.absorbed[a]
            && f.anchored[a].is_none()
            && super::launch::flash_prefill_kernel(graph, a).is_some();
        if ok {
            f.absorbed[a] = true;
            f.anchored[i] = Some(Fused::HeadsLastAttention { attn: a });
        }
    }
}

/// Joins, for each attention over fused rope-and-write keys, its queries' rope and its values'
/// cache write to that launch: same dtype throughout, the two ropes alike (positions,
/// frequencies, parameters), both writes at one position, and nothing reading the three before
/// the last of them.
fn find_rope_qkv(graph: &Graph, consumers: &[Vec<usize>], f: &mut Fusion) {
    for a in 0..graph.nodes.len() {
        let node = &graph.nodes[a];
        let Op::Attention { .. } = node.op else { continue };
        let (q, k, v) = (node.inputs[0].index(), node.inputs[1].index(), node.inputs[2].index());
        let Some(Fused::RopeKvWrite { rope: rk }) = f.anchored[k] else {
            continue;
        };
        let (nq, nk, nv, nrk) = (&graph.nodes[q], &graph.nodes[k], &graph.nodes[v], &graph.nodes[rk]);
        let ropes_alike = matches!(nq.op, Op::Rope { .. })
            && format!("{:?}", nq.op) == format!("{:?}", nrk.op)
            && nq.inputs[1] == nrk.inputs[1]
            && same_values(graph, nq.inputs[2], nrk.inputs[2])
            && nq.shape.len() == 4
            && nq.shape[0] == nrk.shape[0]
            && nq.shape[2..] == nrk.shape[2..];
        let v_write = matches!(nv.op, Op::KvWrite)
            && nv.inputs[2] == nk.inputs[2]
            && nv.shape[..3] == nk.shape[..3]
            && graph.node(nv.inputs[1]).shape[2] == nrk.shape[2];
        let dtype = nq.dtype;
        let one_dtype = [nk.dtype, nv.dtype, graph.node(nv.inputs[1]).dtype]
            .iter()
            .all(|&d| d == dtype);
        let free = [q, v].iter().all(|&j| !f.absorbed[j] && f.anchored[j].is_none());
        let anchor = q.max(k).max(v);
        let unread = [q, k, v].iter().all(|&j| consumers[j].iter().all(|&c| c > anchor));
        if ropes_alike && v_write && one_dtype && free && unread {
            f.anchored[k] = None;
            for j in [q, k, v] {
                f.absorbed[j] = j != anchor;
            }
            let norms = qk_norms(graph, consumers, f, [q, rk]);
            if let Some(norms) = norms {
                for (n, rope) in norms.into_iter().zip([q, rk]) {
                    f.absorbed[n] = true;
                    f.absorbed[graph.nodes[rope].inputs[0].index()] = true;
                }
            }
            // A prefill's q, k and v arrive through [B, T, H, D] → [B, H, T, D] transposes that
            // nothing else reads: the launch reads their inputs instead.
            let swaps = [(q, 0), (rk, 0), (v, 1)].map(|(user, slot)| (graph.nodes[user].inputs[slot].index(), user));
            // (The q and k transposes a norm fold absorbed above read a norm, which is enough.)
            let heads_last = swaps.iter().all(|&(t, user)| {
                heads_swap(&graph.nodes[t].op)
                    && consumers[t] == [user]
                    && (!f.absorbed[t] || norms.is_some() && user != v)
                    && f.anchored[t].is_none()
            });
            if heads_last {
                for (t, _) in swaps {
                    f.absorbed[t] = true;
                }
            }
            f.anchored[anchor] = Some(Fused::RopeQkvWrite {
                q,
                k,
                v,
                heads_last,
                norms,
            });
        }
    }
}

/// Moves each decode rope-and-write (`RopeQkvWrite` of batch 1 at one position, every channel
/// of a head turned, heads a multiple of 16 wide) into the launch of the three products it
/// reads: a `Products` of 4-bit tensor-core GEMVs or dense loads-first ones whose parts (or
/// bias sums) are q, k and v in that order, each read only by its rope (or its per-head norm,
/// where the rope-and-write took the norms: 4-bit products only, heads at most 256 wide) or
/// cache write through reshapes. That launch (`tc_qgemv3_rope`, `dsk_gemv3_rope`) then writes
/// the turned queries and both caches, at the rope-and-write's anchor, so the rope-and-write is
/// no launch. Where the products compute their
/// input's add + RMSNorm, nothing may read the sum they write before the new anchor.
/// `MLXCEL_CUDA_FUSE_PRODUCTS_ROPE=0` turns it off.
fn find_products_rope(graph: &Graph, consumers: &[Vec<usize>], f: &mut Fusion) {
    // The value `user` reads at `slot`, back through reshapes that only the next reads.
    let source = |mut user: usize, slot: usize| -> Option<usize> {
        let mut v = graph.nodes[user].inputs[slot].index();
        loop {
            if consumers[v] != [user] {
                return None;
            }
            if !matches!(graph.nodes[v].op, Op::Reshape) {
                return Some(v);
            }
            (user, v) = (v, graph.nodes[v].inputs[0].index());
        }
    };
    for a in 0..graph.nodes.len() {
        let Some(Fused::RopeQkvWrite {
            q,
            k,
            v,
            heads_last: false,
            norms,
        }) = f.anchored[a]
        else {
            continue;
        };
        let rk = graph.nodes[k].inputs[1].index();
        let (nq, nk) = (&graph.nodes[q], &graph.nodes[rk]);
        let Op::Rope { dims, .. } = nq.op else { continue };
        let d = nq.shape[3];
        let one = nq.shape[0] == 1 && nq.shape[2] == 1 && nk.shape[0] == 1 && nk.shape[2] == 1;
        // The launch's finishing warp holds a normalized head in 256 floats (nn.cu).
        if !one || dims != d || !d.is_multiple_of(16) || norms.is_some() && d > 256 {
            continue;
        }
        // With the norms folded, q and k reach them (their moves absorbed with them).
        let [from_q, from_k] = norms.unwrap_or([q, rk]);
        let (Some(sq), Some(sk), Some(sv)) = (source(from_q, 0), source(from_k, 0), source(v, 1)) else {
            continue;
        };
        // A Products launch runs at its last output (find_products): the last of the three.
        let p = sq.max(sk).max(sv);
        let Some(Fused::Products {
            parts,
            biases,
            norm,
            rope: None,
            ..
        }) = f.anchored[p].clone()
        else {
            continue;
        };
        let out = |j: usize| biases.get(j).copied().unwrap_or(parts[j]);
        if parts.len() != 3 || [out(0), out(1), out(2)] != [sq, sk, sv] {
            continue;
        }
        let first = &graph.nodes[parts[0]];
        let x = graph.node(first.inputs[0]);
        let (kx, total) = (
            *x.shape.last().unwrap_or(&0),
            parts.iter().map(|&j| *graph.nodes[j].shape.last().unwrap_or(&0)).sum(),
        );
        // 4-bit on the tensor cores, or dense on the loads-first GEMV with two rows a block
        // at least (a rope pair's two sets).
        let launchable = match first.op {
            Op::QuantizedMatMul { bits: 4, .. } => {
                super::launch::tc_gemv_kernel("qgemv", x.dtype, 4, 1, total, kx).is_some()
            }
            Op::MatMul { transpose_b: true } if norms.is_none() => {
                super::launch::dense_split(x.dtype, 1, total, kx).is_some_and(|g| g <= 4)
            }
            _ => false,
        };
        // (The norm itself reads the sum inside the launch.)
        let sum_unread = norm.is_none_or(|n| consumers[n.add].iter().all(|&c| c == n.norm || c > a));
        if !launchable || !sum_unread {
            continue;
        }
        f.anchored[p] = None;
        f.absorbed[p] = true;
        f.anchored[a] = Some(Fused::Products {
            parts,
            biases,
            norm,
            rope: Some([q, k, v]),
            qk_norms: norms,
        });
    }
}

/// The widest heads whose q and k norms fold into the rope-and-write launch by default; up to
/// 256 where the heads come from a 4-bit product (`QK_NORM_WIDEST_PRODUCTS`), whose launch then
/// normalizes them in clusters of a head's tiles.
const QK_NORM_WIDEST: usize = 128;
const QK_NORM_WIDEST_PRODUCTS: usize = 256;

/// Whether `v` is a 4-bit product's output, through reshapes.
fn from_q4_product(graph: &Graph, mut v: NodeId) -> bool {
    loop {
        match graph.node(v).op {
            Op::Reshape => v = graph.node(v).inputs[0],
            Op::QuantizedMatMul { bits: 4, .. } => return true,
            _ => return false,
        }
    }
}

/// The per-head RMSNorms the queries' and the keys' ropes (`ropes`) read through their moves to
/// [B, H, T, D]: a transpose, or at one position the reshape it becomes; each norm and move read
/// only by the next, in the ropes' dtype, both norms alike in their offset. By default D is at
/// most 128 (QK_NORM_WIDEST): on the H100, qwen3-8b-4bit decoded 265.9 tok/s with the fold
/// against 257.9 without, qwen3-30b-a3b-4bit 269.1 against 264.0, but gemma3-1b-4bit, six
/// 256-wide head rows a step, 594.4 against 615.1 (a block's warp normalized each head, behind
/// tickets; session 26's rope-and-write with the six rows lost too, 701 against 773). Heads up
/// to 256 wide from 4-bit products fold too (QK_NORM_WIDEST_PRODUCTS): their products' launch
/// normalizes them with a head's 16 tiles in a cluster (launch.rs), gemma3-1b-4bit 769.7,
/// 774.2, 773.3 tok/s against 757.3, 761.1, 759.2 (H100, session 27; on a device without
/// clusters of 16 the tickets again). `MLXCEL_CUDA_FUSE_QK_NORM=all` folds every head up to 256
/// wide (the kernels' limit), `=0` none.
fn qk_norms(graph: &Graph, consumers: &[Vec<usize>], f: &Fusion, ropes: [usize; 2]) -> Option<[usize; 2]> {
    static WIDEST: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();
    let (widest, from_products) = *WIDEST.get_or_init(|| match std::env::var("MLXCEL_CUDA_FUSE_QK_NORM").as_deref() {
        Ok("0") => (0, 0),
        Ok("all") => (256, 256),
        _ => (QK_NORM_WIDEST, QK_NORM_WIDEST_PRODUCTS),
    });
    let norm = |rope: usize| -> Option<usize> {
        let moved = graph.nodes[rope].inputs[0].index();
        let m = &graph.nodes[moved];
        let n = m.inputs.first()?.index();
        let nn = &graph.nodes[n];
        let x = graph.node(*nn.inputs.first()?);
        // [B, T, H, D] → [B, H, T, D]: the transpose, or a reshape where T is 1.
        let one_position = x.shape.len() == 4 && x.shape[1] == 1 && m.shape == [x.shape[0], x.shape[2], 1, x.shape[3]];
        let moves = heads_swap(&m.op) || matches!(m.op, Op::Reshape) && one_position;
        let wide_enough = |d: usize| d <= widest || d <= from_products && from_q4_product(graph, nn.inputs[0]);
        let fits = matches!(nn.op, Op::RmsNorm { .. })
            && x.shape.len() == 4
            && wide_enough(x.shape[3])
            && x.dtype == nn.dtype
            && nn.dtype == graph.nodes[rope].dtype;
        let alone = consumers[moved] == [rope] && consumers[n] == [moved];
        let free = [moved, n].iter().all(|&j| !f.absorbed[j] && f.anchored[j].is_none());
        (moves && fits && alone && free).then_some(n)
    };
    let (nq, nk) = (norm(ropes[0])?, norm(ropes[1])?);
    let offset = |n: usize| match graph.nodes[n].op {
        Op::RmsNorm { unit_offset, .. } => Some(unit_offset),
        _ => None,
    };
    let weight_dtype = |n: usize| graph.node(graph.nodes[n].inputs[1]).dtype;
    (offset(nq) == offset(nk) && weight_dtype(nq) == weight_dtype(nk)).then_some([nq, nk])
}

/// Finds MoE routers: `softmax` over the last axis (at most 256 experts, top at most 32: what
/// `moe_route` sums in the plain kernels' order), read only by a
/// `topk` and the `take_along` of the probabilities at its ids, which only a sum over the chosen
/// and the division by it read (or anything, without renormalization); one float dtype.
fn find_routers(graph: &Graph, consumers: &[Vec<usize>], f: &mut Fusion) {
    let last_axis = |i: usize, axis: usize| axis + 1 == graph.nodes[i].shape.len();
    for t in 0..graph.nodes.len() {
        let Op::TopK { k, .. } = graph.nodes[t].op else {
            continue;
        };
        let sm = graph.nodes[t].inputs[0].index();
        let (Op::Softmax { axis }, dtype) = (&graph.nodes[sm].op, graph.nodes[sm].dtype) else {
            continue;
        };
        let experts = *graph.nodes[sm].shape.last().unwrap_or(&0);
        if !last_axis(sm, *axis) || experts > 256 || k > 32 || !dtype.is_float() || consumers[sm].len() != 2 {
            continue;
        }
        let Some(&g) = consumers[sm].iter().find(|&&c| c != t) else {
            continue;
        };
        let gather = &graph.nodes[g];
        let gathers = matches!(gather.op, Op::TakeAlongAxis { axis } if last_axis(g, axis))
            && gather.inputs[0].index() == sm
            && gather.inputs[1].index() == t
            && gather.dtype == dtype;
        if !gathers || [sm, t, g].iter().any(|&j| f.absorbed[j] || f.anchored[j].is_some()) {
            continue;
        }
        // Renormalized: the sum of the chosen (keepdims) and the division by it (broadcast to
        // the chosen or not), g's only readers.
        let users = &consumers[g];
        let renorm = match users.as_slice() {
            &[a, b] => {
                let (sum, div) = if matches!(graph.nodes[a].op, Op::Reduce { .. }) {
                    (a, b)
                } else {
                    (b, a)
                };
                let (ns, nd) = (&graph.nodes[sum], &graph.nodes[div]);
                let sums =
                    matches!(ns.op, Op::Reduce { op: ReduceOp::Sum, axis, keepdims: true } if last_axis(g, axis));
                let divisor = nd.inputs.get(1).map_or(usize::MAX, |d| d.index());
                let spread = divisor != sum
                    && matches!(graph.nodes.get(divisor).map(|n| &n.op), Some(Op::Broadcast))
                    && graph.nodes[divisor].inputs[0].index() == sum
                    && consumers[divisor] == [div];
                let divides = matches!(nd.op, Op::Binary(BinaryOp::Div))
                    && nd.inputs[0].index() == g
                    && (divisor == sum || spread)
                    && nd.shape == gather.shape;
                let by = if spread { divisor } else { div };
                (sums && divides && consumers[sum] == [by] && ns.dtype == dtype && nd.dtype == dtype).then_some((
                    sum,
                    div,
                    spread.then_some(divisor),
                ))
            }
            _ => None,
        };
        let anchor = renorm.map_or(g, |(_, div, _)| div);
        // The ids are written by the anchor: nothing may read them before it.
        if !consumers[t].iter().all(|&c| c == g || c > anchor) {
            continue;
        }
        let (sum, spread) = renorm.map_or((None, None), |(sum, _, spread)| (Some(sum), spread));
        for j in [Some(sm), Some(t), Some(g), sum, spread].into_iter().flatten() {
            f.absorbed[j] = j != anchor;
        }
        f.anchored[anchor] = Some(Fused::Router {
            softmax: sm,
            topk: t,
            renorm: renorm.is_some(),
        });
    }
}

/// Finds routed GLUs (the gathered gate and up at decode) whose ids come straight from a fused
/// router's top-k, where nothing else reads the ids or the router's weights before the GLU:
/// the router's launch moves into the GLU's ([`Route`]), so the step has no launch between the
/// router's product and the experts. `MLXCEL_CUDA_FUSE_ROUTE_GLU=0`: apart.
fn find_routed_glus(graph: &Graph, consumers: &[Vec<usize>], f: &mut Fusion) {
    for i in 0..graph.nodes.len() {
        let Some(Fused::Glu { g, u, route: None, .. }) = f.anchored[i] else {
            continue;
        };
        if !matches!(graph.nodes[g].op, Op::GatherQuantizedMatMul { .. }) {
            continue;
        }
        let t = graph.nodes[g].inputs[4].index();
        let router = (0..i).find_map(|a| match f.anchored[a] {
            Some(Fused::Router { softmax, topk, renorm }) if topk == t => Some(Route {
                anchor: a,
                softmax,
                topk,
                renorm,
            }),
            _ => None,
        });
        let Some(route) = router else {
            continue;
        };
        // The ids' readers before the GLU: the router's own gather (absorbed into it) and the
        // GLU's two products; the weights' readers all come after it.
        let gather = consumers[route.softmax].iter().copied().find(|&c| c != t);
        let early_ids = consumers[t]
            .iter()
            .any(|&c| c <= i && c != g && c != u && Some(c) != gather);
        let early_weights = consumers[route.anchor].iter().any(|&c| c <= i);
        if early_ids || early_weights || graph.nodes[t].dtype != DType::U32 {
            continue;
        }
        f.anchored[route.anchor] = None;
        f.absorbed[route.anchor] = true;
        if let Some(Fused::Glu { route: r, .. }) = &mut f.anchored[i] {
            *r = Some(route);
        }
    }
}

/// Finds `sum(y · broadcast(w), axis -2)` with y [.., k, d], w [.., k, 1], k <= 32, one float
/// dtype, the product and the broadcast read by nothing else.
fn find_weighted_sums(graph: &Graph, consumers: &[Vec<usize>], f: &mut Fusion) {
    for s in 0..graph.nodes.len() {
        let node = &graph.nodes[s];
        let Op::Reduce {
            op: ReduceOp::Sum,
            axis,
            keepdims: false,
        } = node.op
        else {
            continue;
        };
        let m = node.inputs[0].index();
        let mul = &graph.nodes[m];
        let rank = mul.shape.len();
        if !matches!(mul.op, Op::Binary(BinaryOp::Mul)) || rank < 2 || axis + 2 != rank || consumers[m] != [s] {
            continue;
        }
        let (k, d) = (mul.shape[rank - 2], mul.shape[rank - 1]);
        // One operand is y itself, the other the broadcast of the weights' [.., k, 1].
        let spread = |b: NodeId| {
            let n = graph.node(b);
            let src = n.inputs.first().map(|&i| graph.node(i));
            matches!(n.op, Op::Broadcast)
                && consumers[b.index()] == [m]
                && src.is_some_and(|w| {
                    w.shape.len() == rank && w.shape[rank - 1] == 1 && w.shape[..rank - 1] == mul.shape[..rank - 1]
                })
        };
        let (a, b) = (mul.inputs[0], mul.inputs[1]);
        let (y, bcast) = if spread(b) {
            (a, b)
        } else if spread(a) {
            (b, a)
        } else {
            continue;
        };
        let w = graph.node(bcast).inputs[0];
        let one_dtype = [y, w].iter().all(|&v| graph.node(v).dtype == node.dtype) && mul.dtype == node.dtype;
        let free = [m, bcast.index(), s]
            .iter()
            .all(|&j| !f.absorbed[j] && f.anchored[j].is_none());
        if graph.node(y).shape != mul.shape || !one_dtype || !node.dtype.is_float() || k > 32 || d == 0 || !free {
            continue;
        }
        f.absorbed[m] = true;
        f.absorbed[bcast.index()] = true;
        f.anchored[s] = Some(Fused::WeightedSum { mul: m, y, w });
    }
}

/// Whether `a` and `b` are one value: the same node, or constants with the same contents (each
/// rope builds its own frequency table).
fn same_values(graph: &Graph, a: NodeId, b: NodeId) -> bool {
    if a == b {
        return true;
    }
    match (&graph.node(a).op, &graph.node(b).op) {
        (Op::Constant { data: x }, Op::Constant { data: y }) => {
            x.dtype == y.dtype && x.shape == y.shape && x.bytes() == y.bytes()
        }
        _ => false,
    }
}

/// Groups one-row products of the same x that one GEMV launch takes (4-bit on the tensor cores:
/// same k, group, scale and output dtypes, rows a multiple of its 16-row tile; or dense 16-bit)
/// into launches of up to three: the anchor is the group's last product, and an earlier one
/// joins only if nothing reads it before the anchor. Where every product has a bias sum
/// ([`product_biases`]), the anchor moves to the last of those sums.
fn find_products(graph: &Graph, consumers: &[Vec<usize>], f: &mut Fusion) {
    use std::collections::HashMap;
    let eligible = |i: usize| -> bool {
        let node = &graph.nodes[i];
        let product = matches!(node.op, Op::QuantizedMatMul { .. } | Op::MatMul { transpose_b: true });
        // Weights must be parameters: an earlier product's own inputs are not kept alive until
        // the anchor (x is, as the planning graph's extra input of the anchor).
        if !product || f.absorbed[i] || f.anchored[i].is_some() {
            return false;
        }
        let weights_resident = node.inputs[1..]
            .iter()
            .all(|&w| matches!(graph.node(w).op, Op::Parameter { .. }));
        if !weights_resident {
            return false;
        }
        let x = graph.node(node.inputs[0]);
        let k = *x.shape.last().unwrap_or(&0);
        let n = *node.shape.last().unwrap_or(&0);
        let rows = x.shape.iter().product::<usize>() / k.max(1);
        match node.op {
            Op::QuantizedMatMul { bits, group_size } => {
                group_size % 32 == 0
                    && k.is_multiple_of(group_size)
                    && n.is_multiple_of(16)
                    && graph.node(node.inputs[2]).dtype == graph.node(node.inputs[3]).dtype
                    && (super::launch::tc_gemv_kernel("qgemv", x.dtype, bits, rows, n, k).is_some()
                        || super::launch::qmm_products_plan(graph, &[i]).is_some())
            }
            // Dense 16-bit weights: the CUDA-core GEMV's inner loop, one row a warp.
            Op::MatMul { transpose_b: true } => {
                let w = graph.node(node.inputs[1]);
                rows == 1
                    && x.dtype.is_float()
                    && k.is_multiple_of(8)
                    && w.shape.len() == 2
                    && matches!(w.dtype, DType::F16 | DType::BF16)
            }
            _ => false,
        }
    };
    // Products that may share a launch: same x, op, k, output dtype and weight (or scale) dtype.
    let key = |i: usize| {
        let node = &graph.nodes[i];
        let k = *graph.node(node.inputs[0]).shape.last().unwrap_or(&0);
        let last = *node.inputs.last().expect("a product has inputs");
        (
            node.inputs[0],
            node.dtype,
            graph.node(last).dtype,
            format!("{:?}", node.op),
            k,
        )
    };
    // `MLXCEL_CUDA_FUSE_BIAS=0` leaves the biases' sums as their own launches.
    let biased = !std::env::var("MLXCEL_CUDA_FUSE_BIAS").is_ok_and(|v| v == "0");
    let mut by_x: HashMap<_, Vec<usize>> = HashMap::new();
    for i in (0..graph.nodes.len()).filter(|&i| eligible(i)) {
        by_x.entry(key(i)).or_default().push(i);
    }
    for mut list in by_x.into_values() {
        while let Some(anchor) = list.pop() {
            let mut before = Vec::new();
            while before.len() < 2 {
                let Some(pos) = list.iter().rposition(|&p| consumers[p].iter().all(|&c| c > anchor)) else {
                    break;
                };
                before.insert(0, list.remove(pos));
            }
            if before.is_empty() {
                continue;
            }
            let parts: Vec<usize> = before.into_iter().chain([anchor]).collect();
            let biases = if biased {
                product_biases(graph, consumers, f, &parts)
            } else {
                Vec::new()
            };
            for &p in parts.iter().chain(&biases) {
                f.absorbed[p] = true;
            }
            let at = biases.iter().copied().max().unwrap_or(anchor);
            f.absorbed[at] = false;
            f.anchored[at] = Some(Fused::Products {
                parts,
                biases,
                norm: None,
                rope: None,
                qk_norms: None,
            });
        }
    }
}

/// What sum `sum` (two operands, one of them `product`) adds to the product: its other operand,
/// with the reshapes (aliases) that lead to it followed back, so a bias vector [n] the graph
/// added to a [.., n] product through a reshape to [1, .., n] is the vector itself. None where
/// `product` is not exactly one of the two operands.
pub(crate) fn sum_bias(graph: &Graph, sum: usize, product: usize) -> Option<NodeId> {
    let mut v = match graph.nodes[sum].inputs[..] {
        [l, r] if l.index() == product && r.index() != product => r,
        [l, r] if r.index() == product && l.index() != product => l,
        _ => return None,
    };
    while matches!(graph.node(v).op, Op::Reshape) {
        v = graph.node(v).inputs[0];
    }
    Some(v)
}

/// The bias sums of fused products (`parts[j] + b_j`, each product's only reader, with b_j a
/// parameter vector [n] in the product's dtype), when every part has one and nothing reads the
/// sums before the last of them (where the launch then runs); else none.
fn product_biases(graph: &Graph, consumers: &[Vec<usize>], f: &Fusion, parts: &[usize]) -> Vec<usize> {
    let bias_of = |p: usize| -> Option<usize> {
        let [a] = consumers[p][..] else { return None };
        let sum = graph.nodes.get(a)?;
        let product = &graph.nodes[p];
        let b = graph.node(sum_bias(graph, a, p)?);
        let ok = matches!(sum.op, Op::Binary(BinaryOp::Add))
            && matches!(b.op, Op::Parameter { .. })
            && b.shape[..] == product.shape[product.shape.len() - 1..]
            && b.dtype == product.dtype
            && sum.dtype == product.dtype
            && sum.shape == product.shape
            && !f.absorbed[a]
            && f.anchored[a].is_none();
        ok.then_some(a)
    };
    let Some(biases) = parts.iter().map(|&p| bias_of(p)).collect::<Option<Vec<usize>>>() else {
        return Vec::new();
    };
    let last = biases.iter().copied().max().unwrap_or(0);
    let unread = biases.iter().all(|&s| consumers[s].iter().all(|&c| c > last));
    if unread {
        biases
    } else {
        Vec::new()
    }
}

/// Moves each fused add + RMSNorm whose output only one GEMV launch reads (fused products, or a
/// GLU: 4-bit on the tensor cores, or dense 16-bit with x staged) into that launch: x, the sum
/// and the norm all in one dtype (16-bit for 4-bit weights), one row, and nothing reading the
/// sum before the launch writes it.
fn find_normed_inputs(graph: &Graph, consumers: &[Vec<usize>], f: &mut Fusion) {
    // `MLXCEL_CUDA_FUSE_SANDWICH=0` leaves the sandwich norms (NormIn::pre) as their own launches.
    let sandwich = !std::env::var("MLXCEL_CUDA_FUSE_SANDWICH").is_ok_and(|v| v == "0");
    for r in 0..graph.nodes.len() {
        let Some(Fused::AddRmsNorm { add }) = f.anchored[r] else {
            continue;
        };
        let (norm, sum) = (&graph.nodes[r], &graph.nodes[add]);
        let d = *norm.shape.last().unwrap_or(&0);
        let same_dtype = [sum.inputs[0], sum.inputs[1]]
            .iter()
            .all(|&v| graph.node(v).dtype == norm.dtype)
            && sum.dtype == norm.dtype
            && sum.shape == norm.shape;
        if !same_dtype || norm.shape.iter().product::<usize>() != d {
            continue;
        }
        // The launch reading the norm: the GLU or products anchor its readers belong to.
        let users = &consumers[r];
        let Some(&last) = users.iter().max() else { continue };
        let Some(anchor) = (last..graph.nodes.len()).find(|&m| match &f.anchored[m] {
            Some(Fused::Glu { g, u, .. }) => users.contains(g) || users.contains(u),
            Some(Fused::Products { parts, .. }) => parts.iter().any(|p| users.contains(p)),
            _ => false,
        }) else {
            continue;
        };
        let (mut parts, family): (Vec<usize>, _) = match &f.anchored[anchor] {
            Some(Fused::Glu { g, u, .. }) => (vec![*g, *u], "qglu"),
            Some(Fused::Products { parts, .. }) => (parts.clone(), "qgemv"),
            _ => continue,
        };
        // The products the launch computes (all of one op) take the tensor-core GEMV, or the
        // dense one with x staged.
        let product = &graph.nodes[parts[0]];
        let stages_x = match product.op {
            Op::QuantizedMatMul { bits, .. } => {
                let n = *product.shape.last().unwrap_or(&0);
                super::launch::tc_gemv_kernel(family, norm.dtype, bits, 1, n, d).is_some()
            }
            Op::MatMul { transpose_b: true } => {
                let w = graph.node(product.inputs[1]);
                matches!(w.dtype, DType::F16 | DType::BF16)
                    && norm.dtype.is_float()
                    && super::launch::dense_staging(d).is_some()
            }
            _ => false,
        };
        let mut sorted_users = users.clone();
        sorted_users.sort_unstable();
        parts.sort_unstable();
        let ok = sorted_users == parts
            && parts.iter().all(|&q| graph.nodes[q].inputs[0].index() == r)
            && stages_x
            && consumers[add].iter().all(|&c| c == r || c > anchor);
        if !ok {
            continue;
        }
        let pre = if sandwich {
            sandwich_norm(graph, consumers, f, add)
        } else {
            None
        };
        if let Some(p) = pre {
            f.absorbed[p] = true;
        }
        let normed = Some(NormIn { norm: r, add, pre });
        match f.anchored[anchor].as_mut() {
            Some(Fused::Glu { norm, .. }) | Some(Fused::Products { norm, .. }) => *norm = normed,
            _ => unreachable!("the anchor was matched above"),
        }
        f.anchored[r] = None;
        f.absorbed[r] = true;
    }
}

/// The plain RMSNorm making one operand of residual sum `add` (the sum's only reader, in the
/// sum's dtype and shape, a standalone launch so far), which the GEMV computing rms_norm(sum)
/// can compute too (NormIn::pre); the second operand where both are.
fn sandwich_norm(graph: &Graph, consumers: &[Vec<usize>], f: &Fusion, add: usize) -> Option<usize> {
    let sum = &graph.nodes[add];
    sum.inputs.iter().rev().map(|v| v.index()).find(|&p| {
        let n = &graph.nodes[p];
        if !matches!(n.op, Op::RmsNorm { .. }) {
            return false;
        }
        let x = graph.node(n.inputs[0]);
        consumers[p] == [add]
            && !f.absorbed[p]
            && f.anchored[p].is_none()
            && n.dtype == sum.dtype
            && n.shape == sum.shape
            && x.dtype == sum.dtype
            && x.shape == sum.shape
            && graph.node(n.inputs[1]).dtype.is_float()
    })
}

/// Gate and up products the GLU kernels take: same x, same weight shape and format, few rows.
fn glu_pair(graph: &Graph, g: usize, u: usize) -> bool {
    let (ng, nu) = (&graph.nodes[g], &graph.nodes[u]);
    if ng.inputs.is_empty()
        || nu.inputs.is_empty()
        || ng.inputs[0] != nu.inputs[0]
        || ng.dtype != nu.dtype
        || ng.shape != nu.shape
    {
        return false;
    }
    let x = graph.node(ng.inputs[0]);
    let k = *x.shape.last().unwrap_or(&0);
    let rows = x.shape.iter().product::<usize>() / k.max(1);
    let same = |a: usize, b: usize| {
        let (a, b) = (graph.node(ng.inputs[a]), graph.node(nu.inputs[b]));
        a.dtype == b.dtype && a.shape == b.shape
    };
    if let (
        Op::GatherQuantizedMatMul { bits, group_size },
        Op::GatherQuantizedMatMul {
            bits: bu,
            group_size: gu,
        },
    ) = (&ng.op, &nu.op)
    {
        // Routed experts at decode: the tensor-core gathered GEMV, same ids for both.
        let pairs: usize = graph.node(ng.inputs[4]).shape.iter().product();
        let n = *ng.shape.last().unwrap_or(&0);
        return bits == bu
            && group_size == gu
            && group_size % 32 == 0
            && k.is_multiple_of(*group_size)
            && ng.inputs[4] == nu.inputs[4]
            && (1..4).all(|j| same(j, j))
            && graph.node(ng.inputs[2]).dtype == graph.node(ng.inputs[3]).dtype
            && pairs <= super::launch::GATHER_GEMV_PAIRS
            && super::launch::tc_gemv_kernel("gather_qgemv", x.dtype, *bits, 1, n * pairs, k).is_some();
    }
    // A batched step's gate and up on qmm_ring_glu: one launch for both, act · mul in it.
    if let (
        Op::QuantizedMatMul { bits, group_size },
        Op::QuantizedMatMul {
            bits: bu,
            group_size: gu,
        },
    ) = (&ng.op, &nu.op)
    {
        if rows > 1
            && bits == bu
            && group_size == gu
            && (1..4).all(|j| same(j, j))
            && super::launch::qmm_glu_plan(graph, g).is_some()
        {
            return true;
        }
    }
    if rows == 0 || rows > GEMV_ROWS || !x.dtype.is_float() {
        return false;
    }
    // A few rows by 4-bit weights: qmm_rows takes gate and up as two products (the fused 8-row
    // CUDA-core GLU took 397 µs a launch at 8 rows of llama-3.1-8b's 14336 x 4096).
    if let Op::QuantizedMatMul { bits, group_size } = ng.op {
        let (n, k) = (graph.node(ng.inputs[1]).shape[0], k);
        if super::launch::qmm_rows_kernel(x.dtype, bits, group_size, rows, n, k).is_some() {
            return false;
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use mlxcel_core::{GraphBuilder, HostTensor};

    /// Placeholder 4-bit group-64 weights of `rows` (e.g. `[n]`, or `[experts, n]` stacked) by
    /// k: packed zeros, scales 1, biases 0 (fusion looks at shapes, not values).
    fn zero_weights(b: &mut GraphBuilder, rows: &[usize], k: usize) -> (NodeId, NodeId, NodeId) {
        let n: usize = rows.iter().product();
        let shape = |last: usize| [rows, &[last]].concat();
        let q = b.parameter(
            "q",
            HostTensor::from_slice(&shape(k / 8), &vec![0u32; n * k / 8]).unwrap(),
        );
        let s = b.parameter(
            "s",
            HostTensor::from_f32(DType::F16, &shape(k / 64), &vec![1.0; n * k / 64]).unwrap(),
        );
        let z = b.parameter(
            "z",
            HostTensor::from_f32(DType::F16, &shape(k / 64), &vec![0.0; n * k / 64]).unwrap(),
        );
        (q, s, z)
    }

    /// q, k, v-like products of one f16 x: `consume_first` reads the first before the others run.
    fn three_products(consume_first: bool) -> Graph {
        let k = 256;
        let mut b = GraphBuilder::default();
        let x = b.input("x", DType::F16, &[1, 1, k]);
        let mut outs = Vec::new();
        for (i, n) in [64usize, 32, 32].into_iter().enumerate() {
            let (q, s, z) = zero_weights(&mut b, &[n], k);
            let mut y = b.quantized_matmul(x, q, s, z, 4, 64).unwrap();
            if i == 0 && consume_first {
                y = b.silu(y).unwrap();
            }
            outs.push(y);
        }
        let outs: Vec<NodeId> = outs.into_iter().map(|y| b.silu(y).unwrap()).collect();
        b.finish(&outs)
    }

    fn products(graph: &Graph) -> Vec<usize> {
        (0..graph.nodes.len())
            .filter(|&i| matches!(graph.nodes[i].op, Op::QuantizedMatMul { .. }))
            .collect()
    }

    #[test]
    fn products_of_one_x_share_a_launch() {
        let graph = three_products(false);
        let p = products(&graph);
        let f = Fusion::find(&graph);
        match &f.anchored[p[2]] {
            Some(Fused::Products { parts, .. }) => assert_eq!(parts, &p[..]),
            other => panic!("expected fused products at the last one, got {other:?}"),
        }
        assert!(f.absorbed[p[0]] && f.absorbed[p[1]] && !f.absorbed[p[2]]);
    }

    #[test]
    fn a_product_read_before_the_anchor_stays_apart() {
        let graph = three_products(true);
        let p = products(&graph);
        let f = Fusion::find(&graph);
        assert!(
            !f.absorbed[p[0]] && f.anchored[p[0]].is_none(),
            "the first product is read early"
        );
        match &f.anchored[p[2]] {
            Some(Fused::Products { parts, .. }) => assert_eq!(parts, &p[1..]),
            other => panic!("expected k and v fused, got {other:?}"),
        }
    }

    /// h + d, normed, into q/k/v-like 4-bit products; `norm_read_too` also outputs the norm.
    fn normed_products(norm_read_too: bool) -> (Graph, [usize; 2], Vec<usize>) {
        let k = 256;
        let mut b = GraphBuilder::default();
        let h = b.input("h", DType::F16, &[1, 1, k]);
        let d = b.input("d", DType::F16, &[1, 1, k]);
        let w = b.parameter("w", HostTensor::from_f32(DType::F16, &[k], &vec![1.0; k]).unwrap());
        let sum = b.add(h, d).unwrap();
        let x = b.rms_norm(sum, w, 1e-5, false).unwrap();
        let mut outs = Vec::new();
        for n in [64usize, 32, 32] {
            let (q, s, z) = zero_weights(&mut b, &[n], k);
            outs.push(b.quantized_matmul(x, q, s, z, 4, 64).unwrap());
        }
        let products = outs.iter().map(|o| o.index()).collect();
        // The residual stream goes on past the products.
        let o = b.add(sum, d).unwrap();
        outs.push(o);
        if norm_read_too {
            outs.push(x);
        }
        (b.finish(&outs), [sum.index(), x.index()], products)
    }

    #[test]
    fn an_add_and_norm_read_only_by_fused_products_is_computed_inside_them() {
        let (graph, [sum, norm], p) = normed_products(false);
        let f = Fusion::find(&graph);
        match &f.anchored[p[2]] {
            Some(Fused::Products { norm: Some(n), .. }) => assert_eq!(
                *n,
                NormIn {
                    norm,
                    add: sum,
                    pre: None
                }
            ),
            other => panic!("expected products computing their input, got {other:?}"),
        }
        assert!(f.absorbed[norm] && f.absorbed[sum] && f.anchored[norm].is_none());
        // The products' launch reads the sum's operands and the norm weight: kept alive for it.
        let planned = f.planning_graph(&graph);
        let extra = &planned.nodes[p[2]].inputs[graph.nodes[p[2]].inputs.len()..];
        let want: Vec<NodeId> = [graph.nodes[p[2]].inputs[0]]
            .into_iter()
            .chain(graph.nodes[sum].inputs.iter().copied())
            .chain([graph.nodes[norm].inputs[1], NodeId(sum as u32)])
            .collect();
        assert_eq!(extra, &want[..]);
    }

    /// Qwen2's attention inputs at decode: h + d normed into dense q, k and v products with
    /// biases, then each sum reshaped to heads. `interleaved`: each sum's reshape comes before
    /// the next sum (read before the last of them); else the three sums come first, as
    /// transformer.rs builds them.
    fn biased_products(interleaved: bool) -> (Graph, [usize; 2], Vec<usize>, Vec<usize>) {
        let k = 64;
        let mut b = GraphBuilder::default();
        let h = b.input("h", DType::F16, &[1, 1, k]);
        let d = b.input("d", DType::F16, &[1, 1, k]);
        let w = b.parameter("w", HostTensor::from_f32(DType::F16, &[k], &vec![1.0; k]).unwrap());
        let sum = b.add(h, d).unwrap();
        let x = b.rms_norm(sum, w, 1e-6, false).unwrap();
        let widths = [32usize, 16, 16];
        let products: Vec<NodeId> = widths
            .iter()
            .map(|&n| {
                let w = b.parameter(
                    "w",
                    HostTensor::from_f32(DType::F16, &[n, k], &vec![0.5; n * k]).unwrap(),
                );
                b.matmul_t(x, w).unwrap()
            })
            .collect();
        let mut sums = Vec::new();
        let mut heads = Vec::new();
        for (&p, &n) in products.iter().zip(&widths) {
            let bias = b.parameter("b", HostTensor::from_f32(DType::F16, &[n], &vec![0.25; n]).unwrap());
            sums.push(b.add(p, bias).unwrap());
            if interleaved {
                heads.push(b.reshape(*sums.last().unwrap(), &[1, 1, n / 8, 8]).unwrap());
            }
        }
        if !interleaved {
            heads = sums
                .iter()
                .zip(&widths)
                .map(|(&s, &n)| b.reshape(s, &[1, 1, n / 8, 8]).unwrap())
                .collect();
        }
        let o = b.add(sum, d).unwrap();
        heads.push(o);
        let graph = b.finish(&heads);
        let index = |v: &[NodeId]| v.iter().map(|n| n.index()).collect();
        (graph, [sum.index(), x.index()], index(&products), index(&sums))
    }

    #[test]
    fn product_biases_and_their_add_and_norm_join_the_products_launch() {
        let (graph, [sum, norm], p, biases) = biased_products(false);
        let f = Fusion::find(&graph);
        let anchor = biases[2];
        match &f.anchored[anchor] {
            Some(Fused::Products {
                parts,
                biases: b,
                norm: n,
                ..
            }) => {
                assert_eq!(parts, &p);
                assert_eq!(b, &biases);
                assert_eq!(
                    *n,
                    Some(NormIn {
                        norm,
                        add: sum,
                        pre: None
                    })
                );
            }
            other => panic!("expected biased products at the last sum, got {other:?}"),
        }
        for j in p.iter().chain(&biases[..2]).chain([&sum, &norm]) {
            assert!(f.absorbed[*j] && f.anchored[*j].is_none(), "node {j} is in the launch");
        }
        // The launch reads x (the norm's output, never stored) through its own inputs.
        let planned = f.planning_graph(&graph);
        assert!(planned.nodes[anchor].inputs.contains(&NodeId(norm as u32)));
    }

    #[test]
    fn a_bias_sum_read_before_the_last_stays_its_own_kernel() {
        let (graph, _, p, biases) = biased_products(true);
        let f = Fusion::find(&graph);
        match &f.anchored[p[2]] {
            Some(Fused::Products { parts, biases: b, .. }) => assert!(parts == &p && b.is_empty()),
            other => panic!("expected the products alone, got {other:?}"),
        }
        assert!(biases.iter().all(|&s| !f.absorbed[s]));
    }

    #[test]
    fn a_sandwich_norm_before_the_add_joins_the_products_launch() {
        let k = 256;
        let mut b = GraphBuilder::default();
        let h = b.input("h", DType::F16, &[1, 1, k]);
        let d = b.input("d", DType::F16, &[1, 1, k]);
        let w = b.parameter("w", HostTensor::from_f32(DType::F16, &[k], &vec![0.5; k]).unwrap());
        let post = b.rms_norm(d, w, 1e-6, true).unwrap();
        let sum = b.add(h, post).unwrap();
        let x = b.rms_norm(sum, w, 1e-6, true).unwrap();
        let mut outs: Vec<NodeId> = [64usize, 32, 32]
            .into_iter()
            .map(|n| {
                let (q, s, z) = zero_weights(&mut b, &[n], k);
                b.quantized_matmul(x, q, s, z, 4, 64).unwrap()
            })
            .collect();
        let last = outs[2].index();
        outs.push(sum);
        let graph = b.finish(&outs);
        let f = Fusion::find(&graph);
        let want = NormIn {
            norm: x.index(),
            add: sum.index(),
            pre: Some(post.index()),
        };
        assert!(matches!(&f.anchored[last], Some(Fused::Products { norm: Some(n), .. }) if *n == want));
        assert!(f.absorbed[post.index()]);
        // The launch reads h, and d and the weight the sandwich norm reads, not its output.
        let planned = f.planning_graph(&graph);
        let reads = &planned.nodes[last].inputs;
        assert!([h, d, w].iter().all(|v| reads.contains(v)) && !reads.contains(&post));
    }

    #[test]
    fn a_norm_read_elsewhere_too_stays_its_own_kernel() {
        let (graph, [sum, norm], p) = normed_products(true);
        let f = Fusion::find(&graph);
        assert!(matches!(f.anchored[norm], Some(Fused::AddRmsNorm { add }) if add == sum));
        assert!(matches!(&f.anchored[p[2]], Some(Fused::Products { norm: None, .. })));
    }

    #[test]
    fn rope_into_the_cache_is_one_kernel_unless_the_rotation_is_read_too() {
        for read_too in [false, true] {
            let mut b = GraphBuilder::default();
            let k = b.input("k", DType::F16, &[1, 2, 1, 8]);
            let pos = b.input("pos", DType::I32, &[1]);
            let at = b.input("at", DType::I32, &[]);
            let freqs = b.parameter("freqs", HostTensor::from_f32(DType::F32, &[4], &[1.0; 4]).unwrap());
            let cache = b.state("cache", DType::F16, &[1, 2, 4, 8]);
            let r = b.rope(k, pos, freqs, 8, false, 1.0).unwrap();
            let w = b.kv_write(cache, r, at).unwrap();
            let outs = if read_too { vec![w, r] } else { vec![w] };
            let graph = b.finish(&outs);
            let (ri, wi) = (r.index(), w.index());
            let f = Fusion::find(&graph);
            if read_too {
                assert!(f.anchored[wi].is_none() && !f.absorbed[ri]);
            } else {
                assert!(matches!(f.anchored[wi], Some(Fused::RopeKvWrite { rope }) if rope == ri));
                assert!(f.absorbed[ri]);
            }
        }
    }

    #[test]
    fn a_write_of_a_slot_a_token_keeps_its_rope_apart() {
        // The fused kernels write runs (pos + t); a slot a token (pos [B, T]) is not one.
        let mut b = GraphBuilder::default();
        let k = b.input("k", DType::F16, &[1, 2, 3, 8]);
        let pos = b.input("pos", DType::I32, &[3]);
        let slots = b.input("slots", DType::I32, &[1, 3]);
        let freqs = b.parameter("freqs", HostTensor::from_f32(DType::F32, &[4], &[1.0; 4]).unwrap());
        let cache = b.state("cache", DType::F16, &[1, 2, 8, 8]);
        let r = b.rope(k, pos, freqs, 8, false, 1.0).unwrap();
        let w = b.kv_write(cache, r, slots).unwrap();
        let graph = b.finish(&[w]);
        let f = Fusion::find(&graph);
        assert!(f.anchored[w.index()].is_none() && !f.absorbed[r.index()]);
    }

    /// Rope of q and k (each with its own, equal frequency table, as models build them), the
    /// cache writes of k and v, attention; `q_read_early` also reads the rotated queries before
    /// the cache writes.
    fn rope_qkv(q_read_early: bool) -> (Graph, [usize; 4]) {
        let mut b = GraphBuilder::default();
        let q = b.input("q", DType::F16, &[1, 4, 1, 8]);
        let k = b.input("k", DType::F16, &[1, 2, 1, 8]);
        let v = b.input("v", DType::F16, &[1, 2, 1, 8]);
        let pos = b.input("pos", DType::I32, &[1]);
        let at = b.input("at", DType::I32, &[]);
        let len = b.input("len", DType::I32, &[]);
        let freqs = |b: &mut GraphBuilder| {
            b.constant(HostTensor::from_f32(DType::F32, &[4], &[1.0, 0.5, 0.25, 0.125]).unwrap())
        };
        let (fq, fk) = (freqs(&mut b), freqs(&mut b));
        let kc = b.state("k_cache", DType::F16, &[1, 2, 4, 8]);
        let vc = b.state("v_cache", DType::F16, &[1, 2, 4, 8]);
        let rq = b.rope(q, pos, fq, 8, false, 1.0).unwrap();
        let rk = b.rope(k, pos, fk, 8, false, 1.0).unwrap();
        let early = q_read_early.then(|| b.silu(rq).unwrap());
        let wk = b.kv_write(kc, rk, at).unwrap();
        let wv = b.kv_write(vc, v, at).unwrap();
        let o = b.attention(rq, wk, wv, len, 0.5, true, None, None).unwrap();
        let outs: Vec<NodeId> = [Some(o), early].into_iter().flatten().collect();
        (b.finish(&outs), [rq.index(), rk.index(), wk.index(), wv.index()])
    }

    #[test]
    fn the_ropes_and_cache_writes_before_attention_are_one_launch() {
        let (graph, [rq, rk, wk, wv]) = rope_qkv(false);
        let f = Fusion::find(&graph);
        assert!(
            matches!(f.anchored[wv], Some(Fused::RopeQkvWrite { q, k, v, heads_last: false, .. }) if (q, k, v) == (rq, wk, wv))
        );
        assert!(f.absorbed[rq] && f.absorbed[rk] && f.absorbed[wk] && !f.absorbed[wv]);
        assert!(f.anchored[wk].is_none());
        let (graph, [rq, _, wk, wv]) = rope_qkv(true);
        let f = Fusion::find(&graph);
        // Rotated queries read before the writes: the keys' rope and write stay one kernel, the
        // rest apart.
        assert!(matches!(f.anchored[wk], Some(Fused::RopeKvWrite { .. })));
        assert!(!f.absorbed[rq] && f.anchored[wv].is_none());
    }

    /// A decode attention's q, k and v as a model builds them: three 4-bit products of one x
    /// (16-wide heads: 2 query heads, 1 kv head), reshaped to [1, H, 1, D], the ropes over
    /// `dims`, the cache writes, attention. `read_k` also reads the keys' product elsewhere.
    fn projected_rope_qkv(dims: usize, read_k: bool, qk_norm: bool) -> (Graph, [usize; 7]) {
        let (k, d) = (64, 16);
        let mut b = GraphBuilder::default();
        let x = b.input("x", DType::F16, &[1, 1, k]);
        let pos = b.input("pos", DType::I32, &[1]);
        let at = b.input("at", DType::I32, &[]);
        let len = b.input("len", DType::I32, &[]);
        // Two kv heads with the norms: a [1, 1, 1, D] head's move to [1, 1, 1, D] is no node.
        let kv = if qk_norm { 2 } else { 1 };
        let ys: Vec<NodeId> = [2usize, kv, kv]
            .iter()
            .map(|&h| {
                let (q, s, z) = zero_weights(&mut b, &[h * d], k);
                b.quantized_matmul(x, q, s, z, 4, 64).unwrap()
            })
            .collect();
        let parts: Vec<usize> = ys.iter().map(|y| y.index()).collect();
        let heads: Vec<NodeId> = ys
            .iter()
            .zip([2usize, kv, kv])
            .enumerate()
            .map(|(i, (&y, h))| {
                let mut y4 = b.reshape(y, &[1, 1, h, d]).unwrap();
                if qk_norm && i < 2 {
                    let w = b.parameter("w", HostTensor::from_f32(DType::F16, &[d], &[1.0; 16]).unwrap());
                    y4 = b.rms_norm(y4, w, 1e-6, false).unwrap();
                }
                b.reshape(y4, &[1, h, 1, d]).unwrap()
            })
            .collect();
        let extra = read_k.then(|| b.silu(NodeId(parts[1] as u32)).unwrap());
        let freqs = |b: &mut GraphBuilder| {
            b.constant(HostTensor::from_f32(DType::F32, &[dims / 2], &vec![0.5; dims / 2]).unwrap())
        };
        let (fq, fk) = (freqs(&mut b), freqs(&mut b));
        let kc = b.state("k_cache", DType::F16, &[1, kv, 4, d]);
        let vc = b.state("v_cache", DType::F16, &[1, kv, 4, d]);
        let rq = b.rope(heads[0], pos, fq, dims, false, 1.0).unwrap();
        let rk = b.rope(heads[1], pos, fk, dims, false, 1.0).unwrap();
        let wk = b.kv_write(kc, rk, at).unwrap();
        let wv = b.kv_write(vc, heads[2], at).unwrap();
        let o = b.attention(rq, wk, wv, len, 0.25, true, None, None).unwrap();
        let outs: Vec<NodeId> = [Some(o), extra].into_iter().flatten().collect();
        let ids = [
            parts[0],
            parts[1],
            parts[2],
            rq.index(),
            rk.index(),
            wk.index(),
            wv.index(),
        ];
        (b.finish(&outs), ids)
    }

    #[test]
    fn q_k_v_products_take_their_rope_and_cache_writes() {
        let (graph, [pq, pk, pv, rq, rk, wk, wv]) = projected_rope_qkv(16, false, false);
        let f = Fusion::find(&graph);
        match &f.anchored[wv] {
            Some(Fused::Products {
                parts,
                rope: Some(rope),
                ..
            }) => {
                assert_eq!(parts, &[pq, pk, pv]);
                assert_eq!(rope, &[rq, wk, wv]);
            }
            other => panic!("expected the products with the rope at the values' write, got {other:?}"),
        }
        assert!([pq, pk, pv, rq, rk, wk]
            .iter()
            .all(|&j| f.absorbed[j] && f.anchored[j].is_none()));
        // Off, or a rope that turns part of each head, or the keys' product read elsewhere: the
        // products and the rope-and-write stay two launches.
        std::env::set_var("MLXCEL_CUDA_FUSE_PRODUCTS_ROPE", "0");
        let off = Fusion::find(&graph);
        std::env::remove_var("MLXCEL_CUDA_FUSE_PRODUCTS_ROPE");
        let (partial, [_, _, pv2, _, _, _, wv2]) = projected_rope_qkv(8, false, false);
        let (read, [_, _, pv3, _, _, _, wv3]) = projected_rope_qkv(16, true, false);
        for (f, wv, pv) in [(off, wv, pv), (Fusion::find(&partial), wv2, pv2)] {
            assert!(matches!(f.anchored[wv], Some(Fused::RopeQkvWrite { .. })));
            assert!(matches!(f.anchored[pv], Some(Fused::Products { rope: None, .. })));
        }
        let f = Fusion::find(&read);
        assert!(matches!(f.anchored[wv3], Some(Fused::RopeQkvWrite { .. })));
        assert!(matches!(f.anchored[pv3], Some(Fused::Products { rope: None, .. })));
        // Per-head q and k norms (Qwen3's) go with the rope into the products' launch.
        let (normed, [pq, pk, pv, rq, _, wk, wv]) = projected_rope_qkv(16, false, true);
        let f = Fusion::find(&normed);
        let input = |j: usize, slot: usize| normed.nodes[j].inputs[slot].index();
        // Each rope reads its move to [1, H, 1, D], which reads the norm.
        let norms = |rope: usize| input(input(rope, 0), 0);
        match &f.anchored[wv] {
            Some(Fused::Products {
                parts,
                rope: Some(rope),
                qk_norms: Some(qk),
                ..
            }) => {
                assert_eq!(parts, &[pq, pk, pv]);
                assert_eq!(rope, &[rq, wk, wv]);
                let rk = input(wk, 1);
                assert_eq!(qk, &[norms(rq), norms(rk)]);
            }
            other => panic!("expected the products with the norms and rope, got {other:?}"),
        }
        assert!(f.anchored[pv].is_none() && f.absorbed[pv]);
    }

    /// A prefill's q, k and v come as [B, T, H, D] and reach rope and the cache writes through
    /// transposes, which the launch absorbs (reading their inputs), unless something else reads
    /// one of them.
    #[test]
    fn a_prefills_transposes_join_the_rope_and_cache_write_launch() {
        let build = |extra_read: bool| {
            let mut b = GraphBuilder::default();
            let q = b.input("q", DType::F16, &[1, 3, 4, 8]);
            let k = b.input("k", DType::F16, &[1, 3, 2, 8]);
            let v = b.input("v", DType::F16, &[1, 3, 2, 8]);
            let (tq, tk, tv) = (
                b.swap_axes(q, 1, 2).unwrap(),
                b.swap_axes(k, 1, 2).unwrap(),
                b.swap_axes(v, 1, 2).unwrap(),
            );
            let pos = b.input("pos", DType::I32, &[3]);
            let at = b.input("at", DType::I32, &[]);
            let len = b.input("len", DType::I32, &[]);
            let freqs = |b: &mut GraphBuilder| {
                b.constant(HostTensor::from_f32(DType::F32, &[4], &[1.0, 0.5, 0.25, 0.125]).unwrap())
            };
            let (fq, fk) = (freqs(&mut b), freqs(&mut b));
            let kc = b.state("k_cache", DType::F16, &[1, 2, 8, 8]);
            let vc = b.state("v_cache", DType::F16, &[1, 2, 8, 8]);
            let rq = b.rope(tq, pos, fq, 8, false, 1.0).unwrap();
            let rk = b.rope(tk, pos, fk, 8, false, 1.0).unwrap();
            let wk = b.kv_write(kc, rk, at).unwrap();
            let wv = b.kv_write(vc, tv, at).unwrap();
            let o = b.attention(rq, wk, wv, len, 0.5, true, None, None).unwrap();
            let mut outs = vec![o];
            if extra_read {
                outs.push(b.silu(tv).unwrap());
            }
            (b.finish(&outs), [tq, tk, tv].map(|t| t.index()), wv.index())
        };
        let (graph, swaps, wv) = build(false);
        let f = Fusion::find(&graph);
        assert!(matches!(
            f.anchored[wv],
            Some(Fused::RopeQkvWrite { heads_last: true, .. })
        ));
        assert!(swaps.iter().all(|&t| f.absorbed[t]));
        // The plan keeps the transposes' inputs alive until the launch.
        let planned = f.planning_graph(&graph);
        for t in swaps {
            assert!(planned.nodes[wv].inputs.contains(&graph.nodes[t].inputs[0]));
        }
        let (graph, swaps, wv) = build(true);
        let f = Fusion::find(&graph);
        assert!(matches!(
            f.anchored[wv],
            Some(Fused::RopeQkvWrite { heads_last: false, .. })
        ));
        assert!(swaps.iter().all(|&t| !f.absorbed[t]));
    }

    /// A prefill attention read only by its transpose back to [B, T, H, D] writes that layout
    /// (the flash kernel: f16, 64-wide heads); read elsewhere too, it stays apart.
    #[test]
    fn a_prefill_attention_writes_the_layout_its_transpose_wants() {
        let build = |extra_read: bool| {
            let mut b = GraphBuilder::default();
            let q = b.input("q", DType::F16, &[1, 4, 3, 64]);
            let k = b.input("k", DType::F16, &[1, 2, 8, 64]);
            let v = b.input("v", DType::F16, &[1, 2, 8, 64]);
            let len = b.input("len", DType::I32, &[]);
            let o = b.attention(q, k, v, len, 0.125, true, None, None).unwrap();
            let t = b.swap_axes(o, 1, 2).unwrap();
            let mut outs = vec![b.reshape(t, &[1, 3, 256]).unwrap()];
            if extra_read {
                outs.push(b.silu(o).unwrap());
            }
            (b.finish(&outs), o.index(), t.index())
        };
        let (graph, o, t) = build(false);
        let f = Fusion::find(&graph);
        assert!(matches!(f.anchored[t], Some(Fused::HeadsLastAttention { attn }) if attn == o));
        assert!(f.absorbed[o]);
        assert_eq!(f.planning_graph(&graph).nodes[t].inputs[1..], graph.nodes[o].inputs[..]);
        let (graph, o, t) = build(true);
        let f = Fusion::find(&graph);
        assert!(f.anchored[t].is_none() && !f.absorbed[o]);
    }

    /// act(g) · u outside a GEMV (a prefill's gated MLP) is one launch; an activation read
    /// elsewhere too stays its own kernel.
    #[test]
    fn an_activation_times_a_tensor_is_one_launch() {
        let build = |extra_read: bool| {
            let mut b = GraphBuilder::default();
            let g = b.input("g", DType::F16, &[12, 64]);
            let u = b.input("u", DType::F16, &[12, 64]);
            let a = b.silu(g).unwrap();
            let y = b.mul(u, a).unwrap();
            let mut outs = vec![y];
            if extra_read {
                outs.push(b.exp(a).unwrap());
            }
            (b.finish(&outs), a.index(), u, y.index())
        };
        let (graph, a, u, y) = build(false);
        let f = Fusion::find(&graph);
        assert!(matches!(f.anchored[y], Some(Fused::ActMul { act, u: uu }) if act == a && uu == u));
        assert!(f.absorbed[a]);
        assert!(f.planning_graph(&graph).nodes[y]
            .inputs
            .contains(&graph.nodes[a].inputs[0]));
        let (graph, a, _, y) = build(true);
        let f = Fusion::find(&graph);
        assert!(f.anchored[y].is_none() && !f.absorbed[a]);
    }

    #[test]
    fn dense_products_of_one_x_share_a_launch() {
        let mut b = GraphBuilder::default();
        let x = b.input("x", DType::F16, &[1, 1, 24]);
        let outs: Vec<NodeId> = [24usize, 8, 8]
            .into_iter()
            .map(|n| {
                let w = b.parameter(
                    "w",
                    HostTensor::from_f32(DType::BF16, &[n, 24], &vec![0.5; n * 24]).unwrap(),
                );
                b.matmul_t(x, w).unwrap()
            })
            .collect();
        let graph = b.finish(&outs);
        let f = Fusion::find(&graph);
        let (q, k, v) = (outs[0].index(), outs[1].index(), outs[2].index());
        match &f.anchored[v] {
            Some(Fused::Products { parts, .. }) => assert_eq!(parts, &[q, k, v]),
            other => panic!("expected fused dense products, got {other:?}"),
        }
    }

    #[test]
    fn a_batched_steps_gate_and_up_fuse_where_the_ring_glu_takes_them() {
        let k = 256;
        // At 64 rows gate and up stay two qmm_ring launches (launch.rs, qmm_glu_plan).
        for (rows, fused) in [(16usize, true), (32, true), (64, false), (65, false), (1, true)] {
            let mut b = GraphBuilder::default();
            let x = b.input("x", DType::F16, &[rows, k]);
            let (wg, wu) = (zero_weights(&mut b, &[48], k), zero_weights(&mut b, &[48], k));
            let g = b.quantized_matmul(x, wg.0, wg.1, wg.2, 4, 64).unwrap();
            let a = b.silu(g).unwrap();
            let u = b.quantized_matmul(x, wu.0, wu.1, wu.2, 4, 64).unwrap();
            let y = b.mul(a, u).unwrap();
            let graph = b.finish(&[y]);
            let f = Fusion::find(&graph);
            let glu = matches!(f.anchored[y.index()], Some(Fused::Glu { .. }));
            // Batched steps keep gate and up as two products unless MLXCEL_QMM_GLU=1 (with the
            // ring on).
            let glu_on = std::env::var("MLXCEL_QMM_GLU").is_ok_and(|v| v == "1");
            let fused = fused && (rows == 1 || (glu_on && super::super::launch::qmm_ring_on()));
            assert_eq!(glu, fused, "{rows} rows");
        }
    }

    #[test]
    fn a_batched_steps_q_k_and_v_share_a_launch_where_the_ring_takes_them() {
        let k = 256;
        for (rows, fused) in [(8usize, true), (64, true), (65, false), (1, true)] {
            let mut b = GraphBuilder::default();
            let x = b.input("x", DType::F16, &[rows, k]);
            let outs: Vec<NodeId> = [64usize, 32, 32]
                .into_iter()
                .map(|n| {
                    let (q, s, z) = zero_weights(&mut b, &[n], k);
                    b.quantized_matmul(x, q, s, z, 4, 64).unwrap()
                })
                .collect();
            let graph = b.finish(&outs);
            let f = Fusion::find(&graph);
            let want: Vec<usize> = outs.iter().map(|o| o.index()).collect();
            let one = matches!(&f.anchored[want[2]], Some(Fused::Products { parts, .. }) if *parts == want);
            // With MLXCEL_QMM_RING=0 (or MLXCEL_QMM_QKV=0), batched steps keep three launches.
            let fused = fused && (rows == 1 || super::super::launch::qmm_products_plan(&graph, &want).is_some());
            assert_eq!(one, fused, "{rows} rows");
        }
    }

    #[test]
    fn routed_experts_gate_and_up_fuse_like_a_dense_mlp() {
        let (k, n, e) = (256, 32, 4);
        let mut b = GraphBuilder::default();
        let x = b.input("x", DType::F16, &[1, 1, k]);
        let ids = b.input("ids", DType::U32, &[1, 2]);
        let (wg, wu) = (zero_weights(&mut b, &[e, n], k), zero_weights(&mut b, &[e, n], k));
        let g = b.gather_qmm(x, wg.0, wg.1, wg.2, ids, 4, 64).unwrap();
        let a = b.silu(g).unwrap();
        let u = b.gather_qmm(x, wu.0, wu.1, wu.2, ids, 4, 64).unwrap();
        let y = b.mul(a, u).unwrap();
        let graph = b.finish(&[y]);
        let f = Fusion::find(&graph);
        assert!(
            matches!(f.anchored[y.index()], Some(Fused::Glu { g: gg, u: uu, .. }) if gg == g.index() && uu == u.index())
        );
        // The launch reads the ids: kept alive for it.
        let planned = f.planning_graph(&graph);
        assert!(planned.nodes[y.index()].inputs.contains(&ids));
    }

    /// The router the models build on `logits`: softmax, top 2 (ties to the higher index), the
    /// chosen probabilities and (`renorm`) their renormalization: probs, ids and weights.
    fn route(b: &mut GraphBuilder, logits: NodeId, renorm: bool) -> (NodeId, NodeId, NodeId) {
        let probs = b.softmax(logits, -1).unwrap();
        let ids = b.topk_ties(probs, 2, true).unwrap();
        let mut w = b.take_along_axis(probs, ids, -1).unwrap();
        if renorm {
            let total = b.sum(w, -1, true).unwrap();
            w = b.div(w, total).unwrap();
        }
        (probs, ids, w)
    }

    /// A MoE router after its product: softmax, top 2 of 8, the chosen probabilities, and
    /// (`renorm`) their renormalization, as the models build it.
    fn router(renorm: bool) -> (Graph, Vec<usize>, usize) {
        let mut b = GraphBuilder::default();
        let logits = b.input("logits", DType::F16, &[1, 1, 8]);
        let (probs, ids, w) = route(&mut b, logits, renorm);
        let graph = b.finish(&[ids, w]);
        let first = probs.index();
        let anchor = w.index();
        (graph, (first..anchor).collect(), anchor)
    }

    #[test]
    fn a_moe_router_is_one_launch_with_or_without_renormalization() {
        for renorm in [false, true] {
            let (graph, inner, anchor) = router(renorm);
            let f = Fusion::find(&graph);
            assert!(
                matches!(f.anchored[anchor], Some(Fused::Router { renorm: r, .. }) if r == renorm),
                "renorm {renorm}: {:?}",
                f.anchored[anchor]
            );
            assert!(inner.iter().all(|&j| f.absorbed[j]), "renorm {renorm}");
            assert_eq!(super::super::launches_per_run(&graph), 1, "renorm {renorm}");
        }
    }

    /// A router (softmax over `e` experts of one token's logits, top 2, the chosen
    /// probabilities, renormalized or not) and the routed GLU reading its ids; with `early` a
    /// product of the router's weights made before the GLU. Returns the graph, the logits, the
    /// router's weights and the GLU.
    fn router_and_glu(renorm: bool, early: bool) -> (Graph, NodeId, NodeId, NodeId) {
        let (k, n, e) = (256, 32, 8);
        let mut b = GraphBuilder::default();
        let logits = b.input("logits", DType::F16, &[1, 1, e]);
        let x = b.input("x", DType::F16, &[1, 1, 1, k]);
        let (_, ids, w) = route(&mut b, logits, renorm);
        let before = early.then(|| b.mul(w, w).unwrap());
        let (wg, wu) = (zero_weights(&mut b, &[e, n], k), zero_weights(&mut b, &[e, n], k));
        let g = b.gather_qmm(x, wg.0, wg.1, wg.2, ids, 4, 64).unwrap();
        let a = b.silu(g).unwrap();
        let u = b.gather_qmm(x, wu.0, wu.1, wu.2, ids, 4, 64).unwrap();
        let y = b.mul(a, u).unwrap();
        let outs: Vec<NodeId> = [y, w].into_iter().chain(before).collect();
        (b.finish(&outs), logits, w, y)
    }

    #[test]
    fn a_moe_router_moves_into_the_routed_glu_that_reads_its_ids() {
        for renorm in [false, true] {
            let (graph, logits, w, y) = router_and_glu(renorm, false);
            let f = Fusion::find(&graph);
            let Some(Fused::Glu { route: Some(r), .. }) = &f.anchored[y.index()] else {
                panic!("renorm {renorm}: {:?}", f.anchored[y.index()]);
            };
            assert_eq!((r.anchor, r.renorm), (w.index(), renorm));
            assert!(f.absorbed[w.index()] && f.anchored[w.index()].is_none());
            assert_eq!(super::super::launches_per_run(&graph), 1, "renorm {renorm}");
            // The launch reads the logits: kept alive for it.
            assert!(f.planning_graph(&graph).nodes[y.index()].inputs.contains(&logits));
        }
    }

    #[test]
    fn a_router_whose_weights_are_read_before_the_experts_keeps_its_launch() {
        let (graph, _, w, y) = router_and_glu(true, true);
        let f = Fusion::find(&graph);
        assert!(matches!(f.anchored[y.index()], Some(Fused::Glu { route: None, .. })));
        assert!(matches!(f.anchored[w.index()], Some(Fused::Router { .. })));
        // The router, the product of its weights and the GLU.
        assert_eq!(super::super::launches_per_run(&graph), 3);
    }

    #[test]
    fn the_experts_combine_is_one_launch() {
        let mut b = GraphBuilder::default();
        let y = b.input("y", DType::BF16, &[1, 2, 4, 16]);
        let w = b.input("w", DType::BF16, &[1, 2, 4]);
        let w1 = b.reshape(w, &[1, 2, 4, 1]).unwrap();
        let p = b.mul(y, w1).unwrap();
        let s = b.sum(p, -2, false).unwrap();
        let graph = b.finish(&[s]);
        let f = Fusion::find(&graph);
        assert!(matches!(f.anchored[s.index()], Some(Fused::WeightedSum { mul, .. }) if mul == p.index()));
        assert_eq!(super::super::launches_per_run(&graph), 1);
    }

    #[test]
    fn a_gelu_gated_mlp_is_one_kernel_like_a_silu_one() {
        for act in [UnaryOp::Silu, UnaryOp::GeluTanh, UnaryOp::GeluErf] {
            let mut b = GraphBuilder::default();
            let x = b.input("x", DType::BF16, &[1, 1, 16]);
            let mut proj = || b.parameter("w", HostTensor::from_f32(DType::BF16, &[8, 16], &[0.25; 128]).unwrap());
            let (wg, wu) = (proj(), proj());
            let g = b.matmul_t(x, wg).unwrap();
            let a = b.unary(act, g).unwrap();
            let u = b.matmul_t(x, wu).unwrap();
            let y = b.mul(a, u).unwrap();
            let graph = b.finish(&[y]);
            let f = Fusion::find(&graph);
            assert!(
                matches!(f.anchored[y.index()], Some(Fused::Glu { act: n, .. }) if n == a.index()),
                "{act:?}"
            );
        }
    }
}
