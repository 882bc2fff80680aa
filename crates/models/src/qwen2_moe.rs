//! Qwen2-MoE / Qwen1.5-MoE (`model_type: "qwen2_moe"`): the Qwen2 decoder (q/k/v biases) with
//! routed experts plus an always-on shared expert scaled by `sigmoid(shared_expert_gate(x))`.

use anyhow::{ensure, Result};

use crate::llama::LlamaConfig;
use crate::moe::{MoeConfig, TieBreak};
use crate::transformer::DecoderSpec;

pub fn spec(config: &serde_json::Value) -> Result<DecoderSpec> {
    let c: LlamaConfig = serde_json::from_value(config.clone())?;
    let m: MoeConfig = serde_json::from_value(config.clone())?;
    ensure!(
        m.shared_expert_intermediate_size.is_some(),
        "config.json: qwen2_moe needs shared_expert_intermediate_size"
    );
    Ok(DecoderSpec {
        qkv_bias: true,
        o_bias: false,
        mlp_bias: false,
        moe: Some(m.spec(TieBreak::LowestIndex)?),
        ..c.spec("qwen2_moe")?
    })
}
