//! Gemma 2 (`gemma2`) and Gemma 3 text (`gemma3_text`, and the text part of `gemma3`
//! checkpoints: `text_config`, tensors under `language_model.`). A Llama decoder with
//! `1 + w` RMSNorms, sandwich norms around attention and MLP, a GELU-tanh MLP, embeddings
//! scaled by √hidden, `query_pre_attn_scalar`, sliding-window layers interleaved with global
//! ones, and either soft-capping (Gemma 2) or q/k norms with a local RoPE base (Gemma 3).

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};

use crate::layers::Rope;
use crate::llama::LlamaConfig;
use crate::transformer::{Activation, DecoderOptions, DecoderSpec};

const F16_FRAGILE: &str = "Gemma's residual stream exceeds the f16 range (mlx-lm clips it in f16)";

#[derive(Clone, Copy, PartialEq)]
enum Family {
    Gemma2,
    Gemma3,
}

fn number(c: &Value, key: &str) -> Result<Option<f64>> {
    match c.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .with_context(|| format!("config.json: {key:?} must be a number, found {v}")),
    }
}

fn required(c: &Value, key: &str) -> Result<f64> {
    number(c, key)?.with_context(|| format!("config.json: missing required key {key:?}"))
}

/// Which layers use the sliding window: `layer_types` if given, else the family's rule.
fn sliding_layers(c: &Value, family: Family, layers: usize) -> Result<Vec<bool>> {
    if let Some(types) = c.get("layer_types").filter(|v| !v.is_null()) {
        let types = types
            .as_array()
            .context("config.json: \"layer_types\" must be a list")?;
        ensure!(
            types.len() == layers,
            "config.json: \"layer_types\" lists {} layers but num_hidden_layers is {layers}",
            types.len()
        );
        return types
            .iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                _ => bail!("config.json: layer type {t} is not \"sliding_attention\" or \"full_attention\""),
            })
            .collect();
    }
    Ok(match family {
        // Gemma 2 alternates, starting with a sliding layer (the rule before layer_types).
        Family::Gemma2 => (0..layers).map(|i| i % 2 == 0).collect(),
        Family::Gemma3 => {
            let n = required(c, "sliding_window_pattern")
                .context("config.json: gemma3 needs \"layer_types\" or \"sliding_window_pattern\"")?;
            ensure!(
                n >= 1.0 && n.fract() == 0.0,
                "config.json: sliding_window_pattern {n} must be a positive integer"
            );
            let n = n as usize;
            // Every n-th layer is global, the others slide.
            (0..layers).map(|i| (i + 1) % n != 0).collect()
        }
    })
}

/// The spec for a Gemma text config; `model_type` is the name the spec carries.
fn gemma_spec(c: &Value, family: Family, model_type: &str, prefix: &str) -> Result<DecoderSpec> {
    for key in [
        "hidden_size",
        "num_hidden_layers",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
        "query_pre_attn_scalar",
    ] {
        required(c, key)?;
    }
    if let Some(act) = c
        .get("hidden_activation")
        .or_else(|| c.get("hidden_act"))
        .and_then(|a| a.as_str())
    {
        ensure!(
            matches!(act, "gelu_pytorch_tanh" | "gelu"),
            "config.json: activation {act:?} is not Gemma's GELU (tanh approximation)"
        );
    }
    let mut base = c.clone();
    if number(c, "rope_theta")?.is_none() {
        base["rope_theta"] = json!(if family == Family::Gemma2 { 10000.0 } else { 1_000_000.0 });
    }
    let llama: LlamaConfig = serde_json::from_value(base)?;
    let spec = llama.spec(model_type)?;
    let (layers, hd) = (spec.layers, spec.head_dim);

    let sliding = sliding_layers(c, family, layers)?;
    let windows = if sliding.iter().any(|&s| s) {
        let w = required(c, "sliding_window").context("config.json: sliding-window layers need \"sliding_window\"")?;
        ensure!(
            w >= 1.0 && w.fract() == 0.0,
            "config.json: sliding_window {w} must be a positive integer"
        );
        sliding.iter().map(|&s| s.then_some(w as usize)).collect()
    } else {
        Vec::new()
    };
    let hidden = spec.hidden as f32;
    let scalar = required(c, "query_pre_attn_scalar")? as f32;
    ensure!(scalar > 0.0, "config.json: query_pre_attn_scalar must be positive");
    let mut options = DecoderOptions {
        weight_prefix: prefix.to_string(),
        norm_unit_offset: true,
        embed_scale: Some(hidden.sqrt()),
        sandwich_norms: true,
        activation: Activation::GeluTanh,
        attn_scale: Some(1.0 / scalar.sqrt()),
        windows,
        ..Default::default()
    };
    let softcap = |key: &str| -> Result<Option<f32>> {
        let v = number(c, key)?.map(|v| v as f32);
        ensure!(v.is_none_or(|v| v > 0.0), "config.json: {key} must be positive");
        Ok(v)
    };
    match family {
        Family::Gemma2 => {
            options.attn_softcap = softcap("attn_logit_softcapping")?;
            options.final_softcap = softcap("final_logit_softcapping")?;
        }
        Family::Gemma3 => {
            // mlx-lm and transformers round √hidden to bf16 before scaling.
            options.embed_scale = Some(half::bf16::from_f32(hidden.sqrt()).to_f32());
            let local = number(c, "rope_local_base_freq")?.unwrap_or(10000.0) as f32;
            options.local_rope = Some(Rope::new(hd, local, false));
        }
    }
    Ok(DecoderSpec {
        qk_norm: family == Family::Gemma3,
        // Gemma ties its output head to the embedding; an lm_head is used if a file has one.
        tie_embeddings: true,
        f16_fragile: Some(F16_FRAGILE),
        options,
        ..spec
    })
}

pub fn gemma2_spec(config: &Value) -> Result<DecoderSpec> {
    gemma_spec(config, Family::Gemma2, "gemma2", "")
}

pub fn gemma3_text_spec(config: &Value) -> Result<DecoderSpec> {
    gemma_spec(config, Family::Gemma3, "gemma3_text", "")
}

/// A multimodal `gemma3` checkpoint's language model. Published configs leave most of
/// `text_config` to transformers' `Gemma3TextConfig` defaults, which are filled in here as
/// mlx-lm does; the vocabulary size is the top-level one.
pub fn gemma3_spec(config: &Value) -> Result<DecoderSpec> {
    let mut c = config
        .get("text_config")
        .filter(|t| t.is_object())
        .cloned()
        .context("config.json: gemma3 needs a \"text_config\" object")?;
    let defaults = json!({
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
        "query_pre_attn_scalar": 256, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10000.0,
        "sliding_window": 4096, "rms_norm_eps": 1e-6, "max_position_embeddings": 131072,
    });
    for (k, v) in defaults.as_object().unwrap() {
        if c.get(k).is_none_or(|x| x.is_null()) {
            c[k] = v.clone();
        }
    }
    if c.get("layer_types").is_none_or(|x| x.is_null()) && c.get("sliding_window_pattern").is_none() {
        c["sliding_window_pattern"] = json!(6);
    }
    c["vocab_size"] = config.get("vocab_size").cloned().unwrap_or(json!(262208));
    gemma_spec(&c, Family::Gemma3, "gemma3", "language_model.")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gemma3_text() -> Value {
        json!({
            "model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 4,
            "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 32, "vocab_size": 100, "query_pre_attn_scalar": 32,
            "sliding_window": 8, "sliding_window_pattern": 3, "rope_local_base_freq": 10000.0,
            "rope_theta": 1000000.0, "rope_scaling": {"rope_type": "linear", "factor": 8.0}
        })
    }

    fn err(c: &Value) -> String {
        format!("{:#}", crate::spec_for(c).unwrap_err())
    }

    #[test]
    fn sliding_layers_follow_the_configured_pattern() {
        let s = crate::spec_for(&gemma3_text()).unwrap();
        assert_eq!(s.options.windows, [Some(8), Some(8), None, Some(8)]);
        // Global layers take rope_scaling (linear: positions / 8), local ones the local base.
        assert_eq!(s.rope.scale, 0.125);
        let local = s.options.local_rope.as_ref().unwrap();
        assert_eq!(local.scale, 1.0);
        assert_eq!(local.inv_freq[1], 10000f32.powf(-2.0 / 32.0));
        assert_eq!(s.options.attn_scale, Some(1.0 / 32f32.sqrt()));
        assert_eq!(s.options.embed_scale, Some(8.0));
        assert!(s.qk_norm && s.f16_fragile.is_some());
    }

    #[test]
    fn layer_types_override_the_pattern() {
        let mut c = gemma3_text();
        c["layer_types"] = json!([
            "full_attention",
            "sliding_attention",
            "full_attention",
            "full_attention"
        ]);
        let s = crate::spec_for(&c).unwrap();
        assert_eq!(s.options.windows, [None, Some(8), None, None]);
    }

    #[test]
    fn gemma3_embed_scale_is_rounded_to_bf16() {
        let mut c = gemma3_text();
        c["hidden_size"] = json!(640);
        let s = crate::spec_for(&c).unwrap();
        // √640 = 25.298…; bf16 keeps 25.25.
        assert_eq!(s.options.embed_scale, Some(25.25));
    }

    #[test]
    fn gemma2_alternates_and_softcaps() {
        let c = json!({
            "model_type": "gemma2", "hidden_size": 64, "num_hidden_layers": 3,
            "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 32, "vocab_size": 100, "query_pre_attn_scalar": 144, "sliding_window": 16,
            "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0
        });
        let s = crate::spec_for(&c).unwrap();
        assert_eq!(s.options.windows, [Some(16), None, Some(16)]);
        assert_eq!(
            (s.options.attn_softcap, s.options.final_softcap),
            (Some(50.0), Some(30.0))
        );
        assert!(!s.qk_norm && s.options.local_rope.is_none());
        assert_eq!(s.options.embed_scale, Some(8.0));
    }

    #[test]
    fn multimodal_gemma3_reads_text_config_with_defaults() {
        let c = json!({
            "model_type": "gemma3", "vocab_size": 300,
            "text_config": {"model_type": "gemma3_text", "hidden_size": 64, "num_hidden_layers": 7,
                            "intermediate_size": 128, "sliding_window": 16}
        });
        let s = crate::spec_for(&c).unwrap();
        assert_eq!((s.heads, s.kv_heads, s.head_dim, s.vocab), (8, 4, 256, 300));
        assert_eq!(s.options.weight_prefix, "language_model.");
        let global: Vec<usize> = (0..7).filter(|&i| s.window(i).is_none()).collect();
        assert_eq!(global, [5]);
    }

    #[test]
    fn bad_configs_fail_with_a_clear_message() {
        let mut c = gemma3_text();
        c.as_object_mut().unwrap().remove("head_dim");
        assert!(err(&c).contains("missing required key \"head_dim\""), "{}", err(&c));

        let mut c = gemma3_text();
        c.as_object_mut().unwrap().remove("sliding_window_pattern");
        assert!(
            err(&c).contains("\"layer_types\" or \"sliding_window_pattern\""),
            "{}",
            err(&c)
        );

        let mut c = gemma3_text();
        c["layer_types"] = json!(["full_attention", "sliding_attention"]);
        assert!(
            err(&c).contains("lists 2 layers but num_hidden_layers is 4"),
            "{}",
            err(&c)
        );

        let mut c = gemma3_text();
        c["layer_types"] = json!(["full_attention", "chunked", "full_attention", "full_attention"]);
        assert!(err(&c).contains("\"chunked\" is not"), "{}", err(&c));

        let mut c = gemma3_text();
        c.as_object_mut().unwrap().remove("sliding_window");
        assert!(err(&c).contains("need \"sliding_window\""), "{}", err(&c));

        let mut c = gemma3_text();
        c["hidden_activation"] = json!("silu");
        assert!(err(&c).contains("\"silu\" is not Gemma's GELU"), "{}", err(&c));

        let c = json!({"model_type": "gemma3", "vocab_size": 10});
        assert!(err(&c).contains("needs a \"text_config\""), "{}", err(&c));
    }
}
