//! Random weights in the exact shapes (and MLX layout) of real models, for speed work:
//! `mlxcel bench --preset NAME` and `mlxcel synth`. Quality needs real weights; speed does not.

use std::collections::HashMap;

use anyhow::{bail, Result};
use mlxcel_core::rng::SplitMix64;
use mlxcel_core::tensor::Storage;
use mlxcel_core::{DType, HostTensor};
use serde_json::{json, Value};

use crate::quant::QuantParams;

pub struct Preset {
    pub name: &'static str,
    pub config: fn() -> Value,
    /// None: dense bf16 weights.
    pub quant: Option<QuantParams>,
}

fn llama_3_1_8b() -> Value {
    json!({
        "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 14336,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "max_position_embeddings": 131072, "tie_word_embeddings": false,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192}
    })
}

fn qwen2_5_0_5b() -> Value {
    json!({
        "model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "intermediate_size": 4864,
        "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "max_position_embeddings": 32768, "tie_word_embeddings": true
    })
}

fn smollm2_135m() -> Value {
    json!({
        "model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30, "intermediate_size": 1536,
        "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152, "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0, "max_position_embeddings": 8192, "tie_word_embeddings": true
    })
}

/// Qwen3-30B-A3B's config.json (128 experts, 8 per token, all layers sparse).
fn qwen3_30b_a3b() -> Value {
    json!({
        "model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48, "intermediate_size": 6144,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 40960,
        "tie_word_embeddings": false, "num_experts": 128, "num_experts_per_tok": 8,
        "moe_intermediate_size": 768, "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": []
    })
}

/// google/gemma-3-1b-it's config.json (text only).
fn gemma3_1b() -> Value {
    json!({
        "model_type": "gemma3_text", "hidden_size": 1152, "num_hidden_layers": 26, "intermediate_size": 6912,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 262144,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
        "query_pre_attn_scalar": 256, "sliding_window": 512, "sliding_window_pattern": 6,
        "max_position_embeddings": 32768, "tie_word_embeddings": true
    })
}

pub const PRESETS: &[Preset] = &[
    Preset {
        name: "gemma3-1b-4bit",
        config: gemma3_1b,
        quant: Some(QuantParams {
            bits: 4,
            group_size: 64,
        }),
    },
    Preset {
        name: "llama-3.1-8b-4bit",
        config: llama_3_1_8b,
        quant: Some(QuantParams {
            bits: 4,
            group_size: 64,
        }),
    },
    Preset {
        name: "qwen2.5-0.5b-bf16",
        config: qwen2_5_0_5b,
        quant: None,
    },
    Preset {
        name: "qwen2.5-0.5b-4bit",
        config: qwen2_5_0_5b,
        quant: Some(QuantParams {
            bits: 4,
            group_size: 64,
        }),
    },
    Preset {
        name: "smollm2-135m-4bit",
        config: smollm2_135m,
        quant: Some(QuantParams {
            bits: 4,
            group_size: 32,
        }),
    },
    Preset {
        name: "qwen3-30b-a3b-4bit",
        config: qwen3_30b_a3b,
        quant: Some(QuantParams {
            bits: 4,
            group_size: 64,
        }),
    },
];

pub fn preset(name: &str) -> Result<&'static Preset> {
    match PRESETS.iter().find(|p| p.name == name) {
        Some(p) => Ok(p),
        None => {
            let names: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
            bail!("unknown preset {name:?}; presets: {}", names.join(", "))
        }
    }
}

fn random_bytes(rng: &mut SplitMix64, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n.div_ceil(8) * 8);
    for _ in 0..n.div_ceil(8) {
        out.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    out.truncate(n);
    out
}

/// bf16 values uniform in ±scale.
fn random_bf16(rng: &mut SplitMix64, shape: &[usize], scale: f32) -> Result<HostTensor> {
    let n: usize = shape.iter().product();
    let mut bytes = Vec::with_capacity(2 * n);
    for _ in 0..n {
        bytes.extend_from_slice(&half::bf16::from_f32(rng.next_signed() * scale).to_le_bytes());
    }
    Ok(HostTensor::from_bytes(
        DType::BF16,
        shape.to_vec(),
        Storage::from_vec(bytes),
    )?)
}

fn ones(d: usize) -> Result<HostTensor> {
    Ok(HostTensor::from_f32(DType::BF16, &[d], &vec![1.0; d])?)
}

/// Random tensors under checkpoint names, with the quantized modules listed.
pub struct SynthModel {
    pub config: Value,
    pub tensors: Vec<(String, HostTensor)>,
    pub modules: HashMap<String, QuantParams>,
}

struct Builder {
    rng: SplitMix64,
    quant: Option<QuantParams>,
    out: SynthModel,
}

impl Builder {
    /// A module's weight `[rows, cols]`: dense bf16, or MLX affine with random codes and
    /// scales chosen so dequantized values are about ±`scale`.
    fn weight(&mut self, name: &str, rows: usize, cols: usize, scale: f32) -> Result<()> {
        self.stacked_weight(name, &[], rows, cols, scale, self.quant)
    }

    /// A weight `[lead.., rows, cols]` (experts stacked on a leading axis), quantized by `quant`.
    fn stacked_weight(
        &mut self,
        name: &str,
        lead: &[usize],
        rows: usize,
        cols: usize,
        scale: f32,
        quant: Option<QuantParams>,
    ) -> Result<()> {
        let shape = |tail: &[usize]| [lead, tail].concat();
        let Some(q) = quant else {
            let w = random_bf16(&mut self.rng, &shape(&[rows, cols]), scale)?;
            self.out.tensors.push((format!("{name}.weight"), w));
            return Ok(());
        };
        let rows_all = rows * lead.iter().product::<usize>();
        let words = cols * q.bits as usize / 32;
        let codes = Storage::from_vec(random_bytes(&mut self.rng, rows_all * words * 4));
        let packed = HostTensor::from_bytes(DType::U32, shape(&[rows, words]), codes)?;
        let groups = shape(&[rows, cols / q.group_size]);
        let step = 2.0 * scale / ((1u32 << q.bits) - 1) as f32;
        let n = rows_all * (cols / q.group_size);
        let t = &mut self.out.tensors;
        t.push((format!("{name}.weight"), packed));
        t.push((
            format!("{name}.scales"),
            HostTensor::from_f32(DType::BF16, &groups, &vec![step; n])?,
        ));
        t.push((
            format!("{name}.biases"),
            HostTensor::from_f32(DType::BF16, &groups, &vec![-scale; n])?,
        ));
        self.out.modules.insert(name.to_string(), q);
        Ok(())
    }

    fn push(&mut self, name: String, t: HostTensor) {
        self.out.tensors.push((name, t));
    }
}

/// The preset's config and random tensors under checkpoint names.
pub fn tensors(p: &Preset, seed: u64) -> Result<SynthModel> {
    let c = (p.config)();
    let get = |k: &str| c[k].as_u64().unwrap_or(0) as usize;
    let (d, layers, ff, heads, kv, vocab) = (
        get("hidden_size"),
        get("num_hidden_layers"),
        get("intermediate_size"),
        get("num_attention_heads"),
        get("num_key_value_heads"),
        get("vocab_size"),
    );
    let hd = c["head_dim"].as_u64().map_or(d / heads, |h| h as usize);
    let moe = crate::spec_for(&c)?.moe;
    let bias = c["model_type"] == "qwen2";
    let c_qk_norm = c["model_type"] == "qwen3" || c["model_type"] == "qwen3_moe";
    let gemma = c["model_type"] == "gemma3_text";
    let tied = c["tie_word_embeddings"].as_bool().unwrap_or(false);
    let out = SynthModel {
        config: c,
        tensors: Vec::new(),
        modules: HashMap::new(),
    };
    let mut b = Builder {
        rng: SplitMix64(seed),
        quant: p.quant,
        out,
    };
    let s = 1.0 / (d as f32).sqrt();
    b.weight("model.embed_tokens", vocab, d, 1.0)?;
    for i in 0..layers {
        let l = format!("model.layers.{i}");
        b.push(format!("{l}.input_layernorm.weight"), ones(d)?);
        b.push(format!("{l}.post_attention_layernorm.weight"), ones(d)?);
        if gemma {
            b.push(format!("{l}.pre_feedforward_layernorm.weight"), ones(d)?);
            b.push(format!("{l}.post_feedforward_layernorm.weight"), ones(d)?);
            b.push(format!("{l}.self_attn.q_norm.weight"), ones(hd)?);
            b.push(format!("{l}.self_attn.k_norm.weight"), ones(hd)?);
        }
        for (proj, rows) in [("q_proj", heads * hd), ("k_proj", kv * hd), ("v_proj", kv * hd)] {
            b.weight(&format!("{l}.self_attn.{proj}"), rows, d, s)?;
            if bias {
                let bias = random_bf16(&mut b.rng, &[rows], 0.1)?;
                b.push(format!("{l}.self_attn.{proj}.bias"), bias);
            }
        }
        b.weight(&format!("{l}.self_attn.o_proj"), d, heads * hd, s)?;
        if c_qk_norm {
            b.push(format!("{l}.self_attn.q_norm.weight"), ones(hd)?);
            b.push(format!("{l}.self_attn.k_norm.weight"), ones(hd)?);
        }
        if let Some(m) = moe.as_ref().filter(|m| m.is_sparse(i)) {
            // mlx-community layout: stacked switch_mlp experts, router gate kept at 8 bits.
            let (e, f) = (m.experts, m.intermediate);
            let gate_q = b.quant.map(|_| QuantParams {
                bits: 8,
                group_size: 64,
            });
            b.stacked_weight(&format!("{l}.mlp.gate"), &[], e, d, s, gate_q)?;
            let sm = format!("{l}.mlp.switch_mlp");
            let q = b.quant;
            b.stacked_weight(&format!("{sm}.gate_proj"), &[e], f, d, s, q)?;
            b.stacked_weight(&format!("{sm}.up_proj"), &[e], f, d, s, q)?;
            b.stacked_weight(&format!("{sm}.down_proj"), &[e], d, f, 1.0 / (f as f32).sqrt(), q)?;
            continue;
        }
        b.weight(&format!("{l}.mlp.gate_proj"), ff, d, s)?;
        b.weight(&format!("{l}.mlp.up_proj"), ff, d, s)?;
        b.weight(&format!("{l}.mlp.down_proj"), d, ff, 1.0 / (ff as f32).sqrt())?;
    }
    b.push("model.norm.weight".into(), ones(d)?);
    if !tied {
        b.weight("lm_head", vocab, d, s)?;
    }
    Ok(b.out)
}

/// The preset as a model, straight from memory.
pub fn load(p: &Preset, seed: u64) -> Result<crate::Transformer> {
    let m = tensors(p, seed)?;
    let spec = crate::spec_for(&m.config)?;
    let loader = crate::layers::Loader {
        checkpoint: crate::checkpoint::Checkpoint::from_tensors(m.tensors),
        quant: crate::quant::QuantConfig::from_modules(m.modules),
    };
    crate::Transformer::load(spec, &loader)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_builds_its_shapes() {
        for p in PRESETS.iter().filter(|p| p.name.starts_with("smollm2")) {
            let m = load(p, 1).unwrap();
            assert_eq!(m.spec.layers, 30);
        }
        let spec = crate::spec_for(&(preset("gemma3-1b-4bit").unwrap().config)()).unwrap();
        assert_eq!((spec.head_dim, spec.window(0), spec.window(5)), (256, Some(512), None));
        let Err(e) = preset("nope") else {
            panic!("an unknown preset must fail")
        };
        assert!(e.to_string().contains("llama-3.1-8b-4bit"), "{e}");
    }
}
