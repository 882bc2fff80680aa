//! Llama 2/3.x (`model_type: "llama"`), including Llama 3 RoPE scaling. Also the base config
//! the Qwen files extend.

use anyhow::{bail, Result};
use serde::Deserialize;

use crate::layers::{Llama3Scaling, Rope};
use crate::transformer::DecoderSpec;

fn default_theta() -> f32 {
    10000.0
}
fn default_eps() -> f32 {
    1e-6
}
fn default_max_pos() -> usize {
    4096
}

/// The config.json fields a Llama-style decoder reads (names as in Hugging Face configs).
#[derive(Clone, Debug, Deserialize)]
pub struct LlamaConfig {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub intermediate_size: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub vocab_size: usize,
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f32,
    #[serde(default = "default_theta")]
    pub rope_theta: f32,
    #[serde(default)]
    pub rope_traditional: bool,
    pub rope_scaling: Option<serde_json::Value>,
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub mlp_bias: bool,
}

fn field(scaling: &serde_json::Value, name: &str) -> Result<f32> {
    scaling[name]
        .as_f64()
        .map(|v| v as f32)
        .ok_or_else(|| anyhow::anyhow!("rope_scaling: missing number {name:?}"))
}

impl LlamaConfig {
    pub fn rope(&self, head_dim: usize) -> Result<Rope> {
        let plain = Rope::new(head_dim, self.rope_theta, self.rope_traditional);
        let Some(scaling) = &self.rope_scaling else {
            return Ok(plain);
        };
        let kind = scaling
            .get("rope_type")
            .or_else(|| scaling.get("type"))
            .and_then(|t| t.as_str())
            .unwrap_or("default");
        Ok(match kind {
            "default" => plain,
            "linear" => Rope {
                scale: 1.0 / field(scaling, "factor")?,
                ..plain
            },
            "llama3" => Rope::llama3(
                head_dim,
                self.rope_theta,
                Llama3Scaling {
                    factor: field(scaling, "factor")?,
                    low_freq_factor: field(scaling, "low_freq_factor")?,
                    high_freq_factor: field(scaling, "high_freq_factor")?,
                    original_max_position_embeddings: field(scaling, "original_max_position_embeddings")?,
                },
            ),
            other => bail!("rope_scaling type {other:?} is not supported (default, linear, llama3)"),
        })
    }

    /// The decoder shape these fields describe; `model_type` names the architecture.
    pub fn spec(&self, model_type: &str) -> Result<DecoderSpec> {
        let heads = self.num_attention_heads;
        let kv_heads = self.num_key_value_heads.unwrap_or(heads);
        if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            bail!("config.json: {heads} attention heads cannot share {kv_heads} key/value heads");
        }
        let head_dim = match self.head_dim {
            Some(d) => d,
            None if self.hidden_size.is_multiple_of(heads) => self.hidden_size / heads,
            None => bail!(
                "config.json: hidden_size {} is not a multiple of {heads} heads",
                self.hidden_size
            ),
        };
        Ok(DecoderSpec {
            model_type: model_type.to_string(),
            hidden: self.hidden_size,
            layers: self.num_hidden_layers,
            heads,
            kv_heads,
            head_dim,
            intermediate: self.intermediate_size,
            vocab: self.vocab_size,
            rms_eps: self.rms_norm_eps,
            rope: self.rope(head_dim)?,
            max_position: self.max_position_embeddings,
            tie_embeddings: self.tie_word_embeddings,
            qkv_bias: self.attention_bias,
            o_bias: self.attention_bias,
            mlp_bias: self.mlp_bias,
            qk_norm: false,
            moe: None,
            f16_fragile: None,
            options: Default::default(),
        })
    }
}

pub fn spec(config: &serde_json::Value) -> Result<DecoderSpec> {
    let c: LlamaConfig = serde_json::from_value(config.clone())?;
    c.spec("llama")
}
