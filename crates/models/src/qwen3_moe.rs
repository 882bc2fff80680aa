//! Qwen3-MoE (`model_type: "qwen3_moe"`): the Qwen3 decoder (q/k norm, explicit `head_dim`)
//! with routed experts on the layers `decoder_sparse_step` / `mlp_only_layers` select, the
//! gated MLP of `intermediate_size` on the others.

use anyhow::{ensure, Result};

use crate::llama::LlamaConfig;
use crate::moe::{MoeConfig, TieBreak};
use crate::transformer::DecoderSpec;

pub fn spec(config: &serde_json::Value) -> Result<DecoderSpec> {
    let c: LlamaConfig = serde_json::from_value(config.clone())?;
    let m: MoeConfig = serde_json::from_value(config.clone())?;
    ensure!(c.head_dim.is_some(), "config.json: qwen3_moe needs head_dim");
    Ok(DecoderSpec {
        qk_norm: true,
        moe: Some(m.spec(TieBreak::HighestIndex)?),
        ..c.spec("qwen3_moe")?
    })
}
