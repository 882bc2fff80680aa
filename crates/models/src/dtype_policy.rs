//! The `--dtype` policies: which dtype a model's tensors, activations, KV cache and sampler
//! use, decided once at load for one model on one backend.
//!
//! - `native`: MLX semantics. Tensors as stored, activations in the dtype the embedding gives
//!   (its table, or its quantization scales), every op promoting by MLX's table — so f32 norm
//!   weights in a bf16 checkpoint widen the activations to f32, as they do in mlx-lm.
//! - `f16`, `bf16`, `f32`: every floating tensor (weights, norm scales, embeddings,
//!   quantization scales and biases) converted to that dtype once at load; activations, cache
//!   and sampler in it too. `bf16` also keeps bf16 with f32 in bf16 (nothing f32 should be
//!   left, but the rule makes sure).
//! - `auto`: on the CPU, f32 activations over tensors as stored (the CPU is the oracle: its
//!   kernels widen bf16/f16 weights exactly, so this is the f32 reference); elsewhere `f16`,
//!   or `bf16` for architectures whose spec is flagged [`DecoderSpec::f16_fragile`].

use std::fmt;

use mlxcel_core::dtype::PromotionPolicy;
use mlxcel_core::{BuilderOptions, DType};

use crate::transformer::{DecoderSpec, Transformer};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DTypePolicy {
    Auto,
    Native,
    F16,
    BF16,
    F32,
}

impl DTypePolicy {
    /// What `parse` accepts, for error messages.
    pub const EXPECTED: &'static str = "auto, native, f16, bf16 or f32";

    pub fn parse(s: &str) -> Option<DTypePolicy> {
        Some(match s.trim().to_ascii_lowercase().as_str() {
            "auto" => DTypePolicy::Auto,
            "native" => DTypePolicy::Native,
            "f16" | "float16" => DTypePolicy::F16,
            "bf16" | "bfloat16" => DTypePolicy::BF16,
            "f32" | "float32" => DTypePolicy::F32,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            DTypePolicy::Auto => "auto",
            DTypePolicy::Native => "native",
            DTypePolicy::F16 => "f16",
            DTypePolicy::BF16 => "bf16",
            DTypePolicy::F32 => "f32",
        }
    }
}

impl fmt::Display for DTypePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a policy means for one model on one backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DTypePlan {
    pub policy: DTypePolicy,
    /// Every floating tensor is converted to this at load; None: as stored.
    pub tensors: Option<DType>,
    /// Activations, KV cache and sampler; None: what the stored weights give (`native`).
    pub activations: Option<DType>,
    pub bf16_wins_over_f32: bool,
}

/// The dtype `auto` picks on a non-CPU backend for `spec`.
pub fn auto_device_dtype(spec: &DecoderSpec) -> DType {
    if spec.f16_fragile.is_some() {
        DType::BF16
    } else {
        DType::F16
    }
}

/// `policy` for a model of `spec` on the backend named `backend` (`Backend::name`).
pub fn plan(policy: DTypePolicy, backend: &str, spec: &DecoderSpec) -> DTypePlan {
    let single = |d: DType| DTypePlan {
        policy,
        tensors: Some(d),
        activations: Some(d),
        bf16_wins_over_f32: d == DType::BF16,
    };
    match policy {
        DTypePolicy::Native => DTypePlan {
            policy,
            tensors: None,
            activations: None,
            bf16_wins_over_f32: false,
        },
        DTypePolicy::F16 => single(DType::F16),
        DTypePolicy::BF16 => single(DType::BF16),
        DTypePolicy::F32 => single(DType::F32),
        DTypePolicy::Auto if backend == "cpu" => DTypePlan {
            policy,
            tensors: None,
            activations: Some(DType::F32),
            bf16_wins_over_f32: false,
        },
        DTypePolicy::Auto => single(auto_device_dtype(spec)),
    }
}

impl DTypePlan {
    /// The activation dtype for `model` (loaded under this plan).
    pub fn activation_dtype(&self, model: &Transformer) -> DType {
        self.activations.unwrap_or_else(|| model.stored_dtype())
    }

    pub fn builder_options(&self) -> BuilderOptions {
        BuilderOptions {
            promotion: PromotionPolicy {
                bf16_wins_over_f32: self.bf16_wins_over_f32,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The smallest config each registered model type reads.
    fn config(model_type: &str) -> serde_json::Value {
        let mut c = serde_json::json!({
            "model_type": model_type, "hidden_size": 64, "num_hidden_layers": 2,
            "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 100, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "head_dim": 16,
            "max_position_embeddings": 128, "tie_word_embeddings": true,
            "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32, "query_pre_attn_scalar": 16,
            "sliding_window": 64, "sliding_window_pattern": 2,
        });
        if model_type == "gemma3" {
            c["text_config"] = c.clone();
        }
        c
    }

    #[test]
    fn the_docs_table_lists_what_auto_picks_for_every_model_type() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/dtype-policy.md")).unwrap();
        let rows: Vec<(String, String)> = doc
            .lines()
            .filter_map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                let ty = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
                Some((ty.to_string(), cells.get(2)?.to_string()))
            })
            .filter(|(ty, _)| crate::supported_types().contains(&ty.as_str()))
            .collect();
        let listed: Vec<&str> = rows.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(
            listed,
            crate::supported_types(),
            "docs/dtype-policy.md lists every model type, in order"
        );
        for (ty, picked) in &rows {
            let spec = crate::spec_for(&config(ty)).unwrap_or_else(|e| panic!("{ty}: {e:#}"));
            let want = plan(DTypePolicy::Auto, "cuda", &spec).activations.unwrap().short();
            assert_eq!(picked, want, "{ty}: the docs say {picked}, auto picks {want}");
        }
    }
}
