//! Qwen2 / Qwen2.5 (`model_type: "qwen2"`): a Llama decoder with biases on q, k and v (not on
//! the output projection) and, on small sizes, tied embeddings.

use anyhow::Result;

use crate::llama::LlamaConfig;
use crate::transformer::DecoderSpec;

pub fn spec(config: &serde_json::Value) -> Result<DecoderSpec> {
    let c: LlamaConfig = serde_json::from_value(config.clone())?;
    Ok(DecoderSpec {
        qkv_bias: true,
        o_bias: false,
        mlp_bias: false,
        ..c.spec("qwen2")?
    })
}
