//! Qwen3 (`model_type: "qwen3"`): a Llama decoder with an explicit `head_dim` and RMSNorm on
//! each query and key head before RoPE (`self_attn.q_norm`, `self_attn.k_norm`).

use anyhow::{ensure, Result};

use crate::llama::LlamaConfig;
use crate::transformer::DecoderSpec;

pub fn spec(config: &serde_json::Value) -> Result<DecoderSpec> {
    let c: LlamaConfig = serde_json::from_value(config.clone())?;
    ensure!(c.head_dim.is_some(), "config.json: qwen3 needs head_dim");
    Ok(DecoderSpec {
        qk_norm: true,
        ..c.spec("qwen3")?
    })
}
