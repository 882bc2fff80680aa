//! Bytes a decode step must read from memory, from the step graph itself: what
//! `mlxcel bench` divides by the time per token to get achieved bandwidth.

use anyhow::Result;
use mlxcel_core::tensor::Storage;
use mlxcel_core::{DType, Graph, GraphBuilder, NodeId, Op};
use mlxcel_models::{StepInputs, Transformer};

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Traffic {
    /// Weight bytes one token reads: every parameter once, except tables that are only
    /// gathered from (an untied embedding: one row) and expert stacks (the selected experts).
    pub weights: f64,
    /// Every parameter byte the model holds.
    pub parameters: usize,
    /// KV cache bytes per cached position (read once per step by attention).
    pub kv_per_position: usize,
    /// Cache bytes read every step whatever the context (states not indexed by position).
    pub kv_fixed: usize,
}

impl Traffic {
    /// Bytes per decode token at a cache holding `context` positions.
    pub fn per_token(&self, context: f64) -> f64 {
        self.weights + self.kv_fixed as f64 + self.kv_per_position as f64 * context
    }
}

/// The one-token decode graph of `model`, with caches of `capacity` positions.
fn decode_graph(model: &Transformer, dtype: DType, capacity: usize) -> Result<Graph> {
    let mut b = GraphBuilder::default();
    let inputs = StepInputs {
        tokens: b.input("tokens", DType::I32, &[1, 1]),
        positions: b.input("positions", DType::I32, &[1]),
        offset: b.input("offset", DType::I32, &[]),
        kv_len: NodeId(0),
        tokens_len: 1,
        capacity,
        dtype,
        last_only: true,
    };
    let kv_len = b.add_scalar(inputs.offset, 1.0)?;
    let logits = model.forward(&mut b, &StepInputs { kv_len, ..inputs })?;
    Ok(b.finish(&[logits]))
}

/// The share of parameter `input` (operand `slot` of `user`) that one token reads: 1 for a
/// matmul operand, one row of a gathered table, `k / E` of an `E`-expert stack.
fn share(g: &Graph, user: usize, slot: usize) -> f64 {
    let node = &g.nodes[user];
    let rows = |k: usize| g.node(node.inputs[k]).shape[0] as f64;
    let picked = |k: usize| g.node(node.inputs[k]).shape.iter().product::<usize>() as f64;
    match node.op {
        Op::Gather if slot == 0 => picked(1) / rows(0),
        Op::QuantizedGather { .. } if slot < 3 => picked(3) / rows(0),
        Op::GatherQuantizedMatMul { .. } if (1..4).contains(&slot) => (picked(4) / rows(1)).min(1.0),
        _ => 1.0,
    }
}

pub fn decode_traffic(model: &Transformer, dtype: DType, capacity: usize) -> Result<Traffic> {
    let g = decode_graph(model, dtype, capacity)?;
    // Distinct weight buffers (a tied head and the embedding are one), each with the largest
    // share any of its users reads.
    let mut users: Vec<Vec<(usize, usize)>> = vec![Vec::new(); g.nodes.len()];
    for (u, node) in g.nodes.iter().enumerate() {
        for (slot, x) in node.inputs.iter().enumerate() {
            users[x.index()].push((u, slot));
        }
    }
    let mut weights: Vec<(Storage, usize, f64)> = Vec::new();
    let mut kv_per_position = 0;
    let mut kv_fixed = 0;
    for (i, node) in g.nodes.iter().enumerate() {
        let bytes = node.shape.iter().product::<usize>() * node.dtype.size();
        match &node.op {
            Op::State { .. } if node.shape.get(2) == Some(&capacity) => kv_per_position += bytes / capacity,
            Op::State { .. } => kv_fixed += bytes,
            Op::Parameter { data, .. } => {
                let read = users[i].iter().map(|&(u, slot)| share(&g, u, slot)).fold(0.0, f64::max);
                match weights.iter_mut().find(|(s, _, _)| s.same_as(&data.data)) {
                    Some(w) => w.2 = w.2.max(read),
                    None => weights.push((data.data.clone(), bytes, read)),
                }
            }
            _ => {}
        }
    }
    Ok(Traffic {
        weights: weights.iter().map(|(_, bytes, read)| *bytes as f64 * read).sum(),
        parameters: weights.iter().map(|(_, bytes, _)| bytes).sum(),
        kv_per_position,
        kv_fixed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn preset(name: &str) -> Transformer {
        mlxcel_models::synth::load(mlxcel_models::synth::preset(name).unwrap(), 0).unwrap()
    }

    /// Bytes of an MLX 4-bit matrix `[rows, cols]` with bf16 scales and biases per group.
    fn q4(rows: usize, cols: usize, group: usize) -> usize {
        rows * cols / 2 + 2 * 2 * rows * cols / group
    }

    #[test]
    fn a_tied_embedding_is_read_whole_and_caches_by_position() {
        // tiny-qwen3-4bit: d 128, 2 layers, 4 q heads and 2 kv heads of 32, ff 256, vocab 512,
        // group 32, tied: the embedding is the head, so all of it is read.
        let t = decode_traffic(&preset("tiny-qwen3-4bit"), DType::F32, 64).unwrap();
        let layer = q4(128, 128, 32) + 2 * q4(64, 128, 32) + q4(128, 128, 32) + 3 * q4(256, 128, 32);
        // bf16 norm weights: input and post-attention (128), q and k (32) per layer; final (128).
        let norms = 2 * (2 * (2 * 128 + 2 * 32) + 128);
        let all = q4(512, 128, 32) + 2 * layer + norms;
        assert_eq!(t.parameters, all);
        assert_eq!(t.weights, all as f64);
        // k and v, 2 heads of 32 f32 values, in 2 layers.
        assert_eq!(t.kv_per_position, 2 * 2 * 2 * 32 * 4);
        assert_eq!(t.kv_fixed, 0);
        assert_eq!(t.per_token(10.0), all as f64 + 10.0 * 1024.0);
    }

    #[test]
    fn an_untied_embedding_costs_one_row() {
        let m = preset("tiny-qwen3-4bit");
        let tied = decode_traffic(&m, DType::F32, 8).unwrap();
        // The same shapes untied: a separate lm_head is read whole, the embedding by one row.
        let mut p = mlxcel_models::synth::tensors(mlxcel_models::synth::preset("tiny-qwen3-4bit").unwrap(), 0).unwrap();
        p.config["tie_word_embeddings"] = serde_json::json!(false);
        let embed: Vec<_> = p
            .tensors
            .iter()
            .filter(|(n, _)| n.starts_with("model.embed_tokens"))
            .cloned()
            .collect();
        for (n, t) in embed {
            let copy =
                mlxcel_core::HostTensor::from_bytes(t.dtype, t.shape.clone(), Storage::from_vec(t.bytes().to_vec()));
            p.tensors
                .push((n.replace("model.embed_tokens", "lm_head"), copy.unwrap()));
            p.modules.insert("lm_head".into(), p.modules["model.embed_tokens"]);
        }
        let untied = decode_traffic(&mlxcel_models::synth::from_tensors(p).unwrap(), DType::F32, 8).unwrap();
        let table = q4(512, 128, 32);
        assert_eq!(untied.parameters, tied.parameters + table);
        assert_eq!(untied.weights, tied.weights + table as f64 / 512.0);
    }
}
