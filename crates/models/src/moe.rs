//! Routed experts, shared by every mixture-of-experts architecture (mlx-lm `switch_layers.py`,
//! `qwen3_moe.py`, `qwen2_moe.py`): a linear router, softmax over the experts, the top k with
//! optional renormalization, then the chosen experts' gated MLPs as gathered matmuls over
//! weights stacked on a leading experts axis, summed with the router weights.

use anyhow::{bail, ensure, Result};
use mlxcel_core::tensor::Storage;
use mlxcel_core::{GraphBuilder, HostTensor, NodeId, UnaryOp};
use serde::Deserialize;

use crate::layers::{Linear, Loader, Weight};
use crate::transformer::Mlp;

/// Which expert wins when router probabilities tie for the k-th place.
///
/// MLX's CPU `argpartition` orders equal values by index (checked on mlx 0.32.4 against a
/// total order by (value, index) on 2000 random rows full of ties), so mlx-lm's
/// `argpartition(p)[-k:]` (qwen3_moe) keeps the *higher* indices and
/// `argpartition(-p)[:k]` (qwen2_moe) the *lower* ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TieBreak {
    HighestIndex,
    LowestIndex,
}

/// The sparse block's shape and routing rules, from config.json.
#[derive(Clone, Debug)]
pub struct MoeSpec {
    pub experts: usize,
    pub top_k: usize,
    /// Hidden size of each expert's MLP (`moe_intermediate_size`).
    pub intermediate: usize,
    /// Renormalize the k chosen probabilities to sum to 1.
    pub norm_topk_prob: bool,
    /// Layer `i` is sparse when `(i + 1) % decoder_sparse_step == 0`, unless listed in
    /// `mlp_only_layers`.
    pub decoder_sparse_step: usize,
    pub mlp_only_layers: Vec<usize>,
    /// Hidden size of an always-on shared expert with a sigmoid gate (Qwen2-MoE).
    pub shared_expert: Option<usize>,
    pub ties: TieBreak,
}

impl MoeSpec {
    pub fn is_sparse(&self, layer: usize) -> bool {
        self.experts > 0
            && !self.mlp_only_layers.contains(&layer)
            && (layer + 1).is_multiple_of(self.decoder_sparse_step)
    }
}

fn one() -> usize {
    1
}

/// The config.json fields of Hugging Face's Qwen2-MoE / Qwen3-MoE configs.
#[derive(Clone, Debug, Deserialize)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    #[serde(default = "one")]
    pub decoder_sparse_step: usize,
    #[serde(default)]
    pub mlp_only_layers: Vec<usize>,
    #[serde(default)]
    pub norm_topk_prob: bool,
    pub shared_expert_intermediate_size: Option<usize>,
}

impl MoeConfig {
    pub fn spec(&self, ties: TieBreak) -> Result<MoeSpec> {
        let (e, k) = (self.num_experts, self.num_experts_per_tok);
        ensure!(k > 0, "config.json: num_experts_per_tok must be at least 1");
        ensure!(
            e == 0 || k <= e,
            "config.json: num_experts_per_tok {k} exceeds num_experts {e}"
        );
        ensure!(
            self.decoder_sparse_step > 0,
            "config.json: decoder_sparse_step must be at least 1"
        );
        ensure!(
            self.moe_intermediate_size > 0,
            "config.json: moe_intermediate_size must be at least 1"
        );
        Ok(MoeSpec {
            experts: e,
            top_k: k,
            intermediate: self.moe_intermediate_size,
            norm_topk_prob: self.norm_topk_prob,
            decoder_sparse_step: self.decoder_sparse_step,
            mlp_only_layers: self.mlp_only_layers.clone(),
            shared_expert: self.shared_expert_intermediate_size.filter(|&n| n > 0),
            ties,
        })
    }
}

/// `E` linear layers `[N, K]` stacked as `[E, N, K]` (dense or quantized), applied per token to
/// the experts it was routed to.
pub struct SwitchLinear {
    name: String,
    weight: Weight,
    experts: usize,
    inputs: usize,
    outputs: usize,
}

/// One tensor `[parts, ..]` from equally shaped parts.
fn stack_tensors(what: &str, parts: &[&HostTensor]) -> Result<HostTensor> {
    let first = parts[0];
    let mut bytes = Vec::with_capacity(first.bytes().len() * parts.len());
    for t in parts {
        ensure!(
            t.dtype == first.dtype && t.shape == first.shape,
            "{what}: experts stored as {} {:?} and {} {:?}",
            first.dtype,
            first.shape,
            t.dtype,
            t.shape
        );
        bytes.extend_from_slice(t.bytes());
    }
    let mut shape = vec![parts.len()];
    shape.extend(&first.shape);
    Ok(HostTensor::from_bytes(first.dtype, shape, Storage::from_vec(bytes))?)
}

/// Per-expert weights (Hugging Face's `experts.{e}.*`) as one stacked weight.
fn stack(what: &str, parts: &[Weight]) -> Result<Weight> {
    match &parts[0] {
        Weight::Dense(_) => {
            let mut ts = Vec::with_capacity(parts.len());
            for p in parts {
                let Weight::Dense(t) = p else {
                    bail!("{what}: some experts are quantized and some are not");
                };
                ts.push(t);
            }
            Ok(Weight::Dense(stack_tensors(what, &ts)?))
        }
        Weight::Quantized { q, .. } => {
            let (mut ws, mut ss, mut zs) = (Vec::new(), Vec::new(), Vec::new());
            for p in parts {
                match p {
                    Weight::Quantized {
                        w,
                        scales,
                        biases,
                        q: qe,
                    } if qe == q => {
                        ws.push(w);
                        ss.push(scales);
                        zs.push(biases);
                    }
                    _ => bail!("{what}: experts are quantized differently"),
                }
            }
            Ok(Weight::Quantized {
                w: stack_tensors(what, &ws)?,
                scales: stack_tensors(what, &ss)?,
                biases: stack_tensors(what, &zs)?,
                q: *q,
            })
        }
    }
}

impl SwitchLinear {
    /// `{m}.switch_mlp.{proj}` (mlx-lm's stacked layout), else `{m}.experts.{e}.{proj}` for
    /// every expert, stacked here.
    pub fn load(
        w: &Loader,
        m: &str,
        proj: &str,
        experts: usize,
        inputs: usize,
        outputs: usize,
    ) -> Result<SwitchLinear> {
        let stacked = format!("{m}.switch_mlp.{proj}");
        let weight = if w.checkpoint.contains(&format!("{stacked}.weight")) {
            w.stacked_weight(&stacked, &[experts], outputs, inputs)?
        } else if w.checkpoint.contains(&format!("{m}.experts.0.{proj}.weight")) {
            let parts = (0..experts)
                .map(|e| w.weight(&format!("{m}.experts.{e}.{proj}"), outputs, inputs))
                .collect::<Result<Vec<_>>>()?;
            stack(&format!("{m}.experts.*.{proj}"), &parts)?
        } else {
            bail!("checkpoint has no expert weights {stacked}.weight (nor per-expert {m}.experts.0.{proj}.weight)");
        };
        Ok(SwitchLinear {
            name: stacked,
            weight,
            experts,
            inputs,
            outputs,
        })
    }

    /// `x [.., X, K]` (X = 1: one input for every chosen expert, or X = k) through the experts
    /// `ids [.., k]` → `[.., k, N]`.
    pub fn forward(&self, b: &mut GraphBuilder, x: NodeId, ids: NodeId) -> Result<NodeId> {
        let name = &self.name;
        match &self.weight {
            Weight::Quantized { w, scales, biases, q } => {
                let w = b.parameter(&format!("{name}.weight"), w.clone());
                let s = b.parameter(&format!("{name}.scales"), scales.clone());
                let z = b.parameter(&format!("{name}.biases"), biases.clone());
                Ok(b.gather_qmm(x, w, s, z, ids, q.bits, q.group_size)?)
            }
            Weight::Dense(t) => {
                // No dense gathered matmul op: gather the chosen experts' matrices as rows of
                // an `[E, N·K]` table, then one batched matmul. Costs k·N·K per token, so it
                // suits decode and small prefill chunks.
                let (n, k) = (self.outputs, self.inputs);
                let table = HostTensor::from_bytes(t.dtype, vec![self.experts, n * k], t.data.clone())?;
                let table = b.parameter(&format!("{name}.weight"), table);
                let ids_shape = b.shape(ids).to_vec();
                let rows = b.gather(table, ids)?; // [.., k, N·K]
                let mats = b.reshape(rows, &[ids_shape.as_slice(), &[n, k]].concat())?; // [.., k, N, K]
                let mut xs = b.shape(x).to_vec();
                xs.insert(xs.len() - 1, 1);
                let x = b.reshape(x, &xs)?; // [.., X, 1, K]
                let y = b.matmul_t(x, mats)?; // [.., k, 1, N]
                Ok(b.reshape(y, &[ids_shape.as_slice(), &[n]].concat())?)
            }
        }
    }
}

/// The `k` most probable experts of `probs [.., E]`: ids (`u32 [.., k]`) and their
/// probabilities (`[.., k]`), most probable first, ties broken by `ties`.
pub fn top_experts(b: &mut GraphBuilder, probs: NodeId, k: usize, ties: TieBreak) -> Result<(NodeId, NodeId)> {
    let ids = b.topk_ties(probs, k, ties == TieBreak::HighestIndex)?;
    let p = b.take_along_axis(probs, ids, -1)?;
    Ok((ids, p))
}

/// The sparse feed-forward block: router, routed experts, optional shared expert.
pub struct SparseMoe {
    router: Linear,
    gate: SwitchLinear,
    up: SwitchLinear,
    down: SwitchLinear,
    shared: Option<(Mlp, Linear)>,
    spec: MoeSpec,
}

impl SparseMoe {
    /// The block at `m` (e.g. `model.layers.3.mlp`): router `{m}.gate`, experts, and
    /// `{m}.shared_expert` / `{m}.shared_expert_gate` when the spec has a shared expert.
    pub fn load(w: &Loader, m: &str, d: usize, spec: &MoeSpec) -> Result<SparseMoe> {
        let (e, ff) = (spec.experts, spec.intermediate);
        let shared = match spec.shared_expert {
            Some(n) => Some((
                Mlp::load(
                    w,
                    &format!("{m}.shared_expert"),
                    d,
                    n,
                    false,
                    crate::transformer::Activation::Silu,
                )?,
                w.linear(&format!("{m}.shared_expert_gate"), d, 1, false)?,
            )),
            None => None,
        };
        Ok(SparseMoe {
            router: w.linear(&format!("{m}.gate"), d, e, false)?,
            gate: SwitchLinear::load(w, m, "gate_proj", e, d, ff)?,
            up: SwitchLinear::load(w, m, "up_proj", e, d, ff)?,
            down: SwitchLinear::load(w, m, "down_proj", e, ff, d)?,
            shared,
            spec: spec.clone(),
        })
    }

    /// The router's choice for `x [.., T, D]`: expert ids `u32 [.., T, k]` and their weights.
    pub fn route(&self, b: &mut GraphBuilder, x: NodeId) -> Result<(NodeId, NodeId)> {
        let logits = self.router.forward(b, x)?; // [.., T, E]
        let probs = b.softmax(logits, -1)?;
        let (ids, mut weights) = top_experts(b, probs, self.spec.top_k, self.spec.ties)?; // [.., T, k]
        if self.spec.norm_topk_prob {
            let total = b.sum(weights, -1, true)?;
            weights = b.div(weights, total)?;
        }
        Ok((b.name(ids, "expert_ids"), b.name(weights, "expert_weights")))
    }

    /// `x [.., T, D]` → `[.., T, D]`.
    pub fn forward(&self, b: &mut GraphBuilder, x: NodeId) -> Result<NodeId> {
        let (ids, weights) = self.route(b, x)?;
        let mut xs = b.shape(x).to_vec();
        xs.insert(xs.len() - 1, 1);
        let xe = b.reshape(x, &xs)?; // [.., T, 1, D]: one input for all k experts
        let g = self.gate.forward(b, xe, ids)?; // [.., T, k, F]
        let g = b.silu(g)?;
        let u = self.up.forward(b, xe, ids)?;
        let h = b.mul(g, u)?;
        let y = self.down.forward(b, h, ids)?; // [.., T, k, D]
        let mut ws = b.shape(weights).to_vec();
        ws.push(1);
        let weights = b.reshape(weights, &ws)?; // [.., T, k, 1]
        let y = b.mul(y, weights)?;
        let mut y = b.sum(y, -2, false)?; // [.., T, D]
        if let Some((mlp, gate)) = &self.shared {
            let s = mlp.forward(b, x)?;
            let g = gate.forward(b, x)?; // [.., T, 1]
            let g = b.unary(UnaryOp::Sigmoid, g)?;
            let s = b.mul(g, s)?;
            y = b.add(y, s)?;
        }
        Ok(y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::Checkpoint;
    use crate::quant::QuantConfig;
    use mlxcel_core::DType;

    fn config(extra: serde_json::Value) -> serde_json::Value {
        let mut c = serde_json::json!({
            "model_type": "qwen3_moe", "hidden_size": 8, "num_hidden_layers": 4, "intermediate_size": 16,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4, "vocab_size": 10,
            "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
            "norm_topk_prob": true
        });
        c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        c
    }

    fn spec_error(extra: serde_json::Value) -> String {
        format!("{:#}", crate::spec_for(&config(extra)).unwrap_err())
    }

    #[test]
    fn bad_routing_configs_are_clear_errors() {
        let e = spec_error(serde_json::json!({"num_experts_per_tok": 5}));
        assert!(e.contains("num_experts_per_tok 5 exceeds num_experts 4"), "{e}");
        let e = spec_error(serde_json::json!({"num_experts_per_tok": 0}));
        assert!(e.contains("at least 1"), "{e}");
        let e = spec_error(serde_json::json!({"decoder_sparse_step": 0}));
        assert!(e.contains("decoder_sparse_step"), "{e}");
        let mut c = config(serde_json::json!({}));
        c.as_object_mut().unwrap().remove("moe_intermediate_size");
        let e = format!("{:#}", crate::spec_for(&c).unwrap_err());
        assert!(e.contains("moe_intermediate_size"), "{e}");
    }

    #[test]
    fn sparse_step_and_mlp_only_layers_pick_the_sparse_layers() {
        let spec = crate::spec_for(&config(serde_json::json!({
            "decoder_sparse_step": 2, "mlp_only_layers": [3]
        })))
        .unwrap();
        let moe = spec.moe.unwrap();
        let sparse: Vec<bool> = (0..4).map(|i| moe.is_sparse(i)).collect();
        assert_eq!(sparse, [false, true, false, false]);
        assert_eq!(moe.ties, TieBreak::HighestIndex);
        let all = crate::spec_for(&config(serde_json::json!({}))).unwrap().moe.unwrap();
        assert!((0..4).all(|i| all.is_sparse(i)));
    }

    fn zeros(shape: &[usize]) -> HostTensor {
        HostTensor::zeros(DType::F32, shape)
    }

    fn load_block(tensors: Vec<(String, HostTensor)>) -> Result<SparseMoe> {
        let spec = crate::spec_for(&config(serde_json::json!({}))).unwrap().moe.unwrap();
        let loader = Loader {
            checkpoint: Checkpoint::from_tensors(tensors),
            quant: QuantConfig::default(),
        };
        SparseMoe::load(&loader, "mlp", 8, &spec)
    }

    fn router() -> (String, HostTensor) {
        ("mlp.gate.weight".into(), zeros(&[4, 8]))
    }

    #[test]
    fn missing_or_misshapen_expert_tensors_are_clear_errors() {
        let Err(e) = load_block(vec![router()]) else {
            panic!("a block without experts must fail")
        };
        assert!(
            e.to_string()
                .contains("no expert weights mlp.switch_mlp.gate_proj.weight"),
            "{e}"
        );

        // Per-expert names with expert 2 missing.
        let mut t = vec![router()];
        for e in [0, 1, 3] {
            for (p, shape) in [("gate_proj", [8, 8]), ("up_proj", [8, 8]), ("down_proj", [8, 8])] {
                t.push((format!("mlp.experts.{e}.{p}.weight"), zeros(&shape)));
            }
        }
        let Err(e) = load_block(t) else {
            panic!("a missing expert must fail")
        };
        assert!(e.to_string().contains("mlp.experts.2.gate_proj.weight"), "{e}");

        // Stacked weights for 3 experts where the config says 4.
        let mut t = vec![router()];
        for p in ["gate_proj", "up_proj", "down_proj"] {
            t.push((format!("mlp.switch_mlp.{p}.weight"), zeros(&[3, 8, 8])));
        }
        let Err(e) = load_block(t) else {
            panic!("a wrong expert count must fail")
        };
        assert!(
            e.to_string().contains("expected shape [4, 8, 8], found [3, 8, 8]"),
            "{e}"
        );

        // Per-expert weights of different shapes.
        let mut t = vec![router()];
        for e in 0..4 {
            let cols = if e == 1 { 7 } else { 8 };
            t.push((format!("mlp.experts.{e}.gate_proj.weight"), zeros(&[8, cols])));
        }
        let Err(e) = load_block(t) else {
            panic!("misshapen experts must fail")
        };
        assert!(e.to_string().contains("expected shape [8, 8], found [8, 7]"), "{e}");

        // The router must have one row per expert.
        let mut t = vec![("mlp.gate.weight".to_string(), zeros(&[3, 8]))];
        for p in ["gate_proj", "up_proj", "down_proj"] {
            t.push((format!("mlp.switch_mlp.{p}.weight"), zeros(&[4, 8, 8])));
        }
        let Err(e) = load_block(t) else {
            panic!("a short router must fail")
        };
        assert!(e.to_string().contains("mlp.gate.weight: expected shape [4, 8]"), "{e}");
    }

    #[test]
    fn either_tie_rule_routes_with_one_topk_and_one_gather() {
        // The tie rule is TopK's own: no flipped copy of the probabilities, no id arithmetic.
        for (ties, high) in [(TieBreak::HighestIndex, true), (TieBreak::LowestIndex, false)] {
            let mut b = mlxcel_core::GraphBuilder::default();
            let probs = b.input("probs", DType::F32, &[1, 1, 8]);
            let (ids, p) = top_experts(&mut b, probs, 2, ties).unwrap();
            let g = b.finish(&[ids, p]);
            let ops: Vec<&str> = g.nodes.iter().map(|n| n.op.name()).collect();
            assert_eq!(ops, ["input", "topk", "take_along_axis"], "{ties:?}");
            assert!(matches!(g.nodes[1].op, mlxcel_core::Op::TopK { k: 2, higher_on_ties } if higher_on_ties == high));
        }
    }
}
