//! A GGUF file as a model: its metadata becomes an HF-style config.json, its tensors get
//! checkpoint names, and its quantized tensors become MLX affine triplets where that is exact
//! (Q4_0, Q4_1, Q8_0, Q5_0/Q5_1 as 8-bit; Q4_K/Q5_K with f32 scales); the rest is
//! dequantized to f16. Nothing is lost by default.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use mlxcel_core::{DType, HostTensor};
use serde_json::{json, Value};

use crate::gguf::{affine_bits, GgmlType, GgufFile};
use crate::quant::QuantParams;

/// A GGUF model in checkpoint form.
pub struct GgufModel {
    pub file: GgufFile,
    /// HF-style config.json for the architecture.
    pub config: Value,
    /// Tensors under checkpoint (Hugging Face / mlx-lm) names.
    pub tensors: Vec<(String, HostTensor)>,
    /// Quantized modules and their parameters.
    pub quant: HashMap<String, QuantParams>,
}

/// GGUF tensor name (without `.weight`/`.bias`) → checkpoint module name.
fn module_name(gguf: &str, arch: &str) -> Option<String> {
    let top = match gguf {
        "token_embd" => Some("model.embed_tokens"),
        "output_norm" => Some("model.norm"),
        "output" => Some("lm_head"),
        _ => None,
    };
    if let Some(t) = top {
        return Some(t.to_string());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    let sub = match (arch, part) {
        // Gemma's sandwich norms: ffn_norm is the one before the MLP, not after attention.
        ("gemma3", "ffn_norm") => "pre_feedforward_layernorm",
        ("gemma3", "post_attention_norm") => "post_attention_layernorm",
        ("gemma3", "post_ffw_norm") => "post_feedforward_layernorm",
        (_, part) => match part {
            "attn_norm" => "input_layernorm",
            "ffn_norm" => "post_attention_layernorm",
            "attn_q" => "self_attn.q_proj",
            "attn_k" => "self_attn.k_proj",
            "attn_v" => "self_attn.v_proj",
            "attn_output" => "self_attn.o_proj",
            "attn_q_norm" => "self_attn.q_norm",
            "attn_k_norm" => "self_attn.k_norm",
            "ffn_gate" => "mlp.gate_proj",
            "ffn_up" => "mlp.up_proj",
            "ffn_down" => "mlp.down_proj",
            _ => return None,
        },
    };
    Some(format!("model.layers.{layer}.{sub}"))
}

fn config(f: &GgufFile) -> Result<(Value, String)> {
    let arch = f.get_str("general.architecture")?.to_string();
    let model_type = match arch.as_str() {
        "llama" | "qwen2" | "qwen3" => arch.clone(),
        "gemma3" => "gemma3_text".to_string(),
        other => bail!("GGUF architecture {other:?} is not supported (llama, qwen2, qwen3, gemma3)"),
    };
    let key = |k: &str| format!("{arch}.{k}");
    let heads = f.get_u64(&key("attention.head_count"))?;
    let hidden = f.get_u64(&key("embedding_length"))?;
    let kv_heads = f
        .get(&key("attention.head_count_kv"))
        .and_then(|v| v.as_u64())
        .unwrap_or(heads);
    if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        bail!("GGUF: {heads} attention heads (attention.head_count) cannot share {kv_heads} key/value heads (attention.head_count_kv)");
    }
    let head_dim = f
        .get(&key("attention.key_length"))
        .and_then(|v| v.as_u64())
        .unwrap_or(hidden / heads.max(1));
    if let Some(rot) = f.get(&key("rope.dimension_count")).and_then(|v| v.as_u64()) {
        if rot != head_dim {
            bail!("GGUF rotates {rot} of {head_dim} head channels (partial RoPE), which is not supported yet");
        }
    }
    if f.contains("rope_freqs.weight") {
        bail!("GGUF carries rope_freqs.weight (scaled RoPE factors), which is not supported yet");
    }
    let vocab = match f.get(&key("vocab_size")).and_then(|v| v.as_u64()) {
        Some(v) => v,
        None => f.get_array("tokenizer.ggml.tokens")?.len() as u64,
    };
    let mut c = json!({
        "model_type": model_type,
        "hidden_size": hidden,
        "num_hidden_layers": f.get_u64(&key("block_count"))?,
        "intermediate_size": f.get_u64(&key("feed_forward_length"))?,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "rms_norm_eps": f.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
        "rope_theta": f.get(&key("rope.freq_base")).and_then(|v| v.as_f32()).unwrap_or(10000.0),
        "max_position_embeddings": f.get(&key("context_length")).and_then(|v| v.as_u64()).unwrap_or(4096),
        "tie_word_embeddings": !f.contains("output.weight"),
    });
    for (gguf, hf) in [
        ("tokenizer.ggml.bos_token_id", "bos_token_id"),
        ("tokenizer.ggml.eos_token_id", "eos_token_id"),
    ] {
        if let Some(id) = f.get(gguf).and_then(|v| v.as_u64()) {
            c[hf] = json!(id);
        }
    }
    if arch == "gemma3" {
        gemma3_config(f, &mut c)?;
    }
    if let Some(kind) = f.get(&key("rope.scaling.type")).and_then(|v| v.as_str()) {
        match kind {
            "none" => {}
            "linear" => {
                c["rope_scaling"] = json!({"type": "linear", "factor": f.get_f32(&key("rope.scaling.factor"))?})
            }
            other => bail!("GGUF rope scaling {other:?} is not supported yet"),
        }
    }
    Ok((c, arch))
}

/// Gemma 3 keys a GGUF does not carry are llama.cpp's fixed choices for the architecture:
/// every 6th layer global (unless the file lists the pattern per layer), local RoPE base
/// 10000, and attention scaled by 1/√head_dim except on the 27B (62 layers), which uses
/// √(hidden / heads).
fn gemma3_config(f: &GgufFile, c: &mut Value) -> Result<()> {
    let window = f.get_u64("gemma3.attention.sliding_window")?;
    c["sliding_window"] = json!(window);
    match f.get("gemma3.attention.sliding_window_pattern") {
        Some(v) => {
            let per_layer = v
                .as_array()
                .context("gemma3.attention.sliding_window_pattern must be an array")?;
            let types: Vec<&str> = per_layer
                .iter()
                .map(|s| match s.as_bool() {
                    Some(true) => "sliding_attention",
                    _ => "full_attention",
                })
                .collect();
            c["layer_types"] = json!(types);
        }
        None => c["sliding_window_pattern"] = json!(6),
    }
    let local = f
        .get("gemma3.rope.freq_base_swa")
        .and_then(|v| v.as_f32())
        .unwrap_or(10000.0);
    c["rope_local_base_freq"] = json!(local);
    let layers = c["num_hidden_layers"].as_u64().unwrap_or(0);
    let heads = c["num_attention_heads"].as_u64().unwrap_or(1).max(1);
    c["query_pre_attn_scalar"] = if layers == 62 {
        json!(c["hidden_size"].as_u64().unwrap_or(0) / heads)
    } else {
        c["head_dim"].clone()
    };
    Ok(())
}

/// llama.cpp's converter stores Gemma's `1 + w` norm weights with the 1 already added; this
/// takes it off again so that the checkpoint holds `w`, as the Hugging Face one does.
fn remove_unit_offset(t: &HostTensor) -> Result<HostTensor> {
    let w: Vec<f32> = t.to_f32_vec().iter().map(|v| v - 1.0).collect();
    Ok(HostTensor::from_f32(DType::F32, &t.shape, &w)?)
}

/// llama.cpp's converter stores q/k rows of each head interleaved (pairs `2i, 2i+1`) for its
/// RoPE; this puts them back in Hugging Face's half-split order (`i`, `i + d/2`).
fn unpermute_rows(t: &HostTensor, heads: usize) -> Result<HostTensor> {
    let rows = t.shape[0];
    let row_bytes = t.bytes().len() / rows.max(1);
    let hd = rows / heads;
    let mut out = vec![0u8; t.bytes().len()];
    for h in 0..heads {
        for i in 0..hd / 2 {
            for j in 0..2 {
                let (src, dst) = (h * hd + 2 * i + j, h * hd + j * (hd / 2) + i);
                out[dst * row_bytes..(dst + 1) * row_bytes]
                    .copy_from_slice(&t.bytes()[src * row_bytes..(src + 1) * row_bytes]);
            }
        }
    }
    Ok(HostTensor::from_bytes(
        t.dtype,
        t.shape.clone(),
        mlxcel_core::tensor::Storage::from_vec(out),
    )?)
}

/// Reads `path` into checkpoint form; `progress(done, total)` counts tensors converted.
pub fn read(path: &Path, progress: &mut dyn FnMut(usize, usize)) -> Result<GgufModel> {
    let file = GgufFile::open(path)?;
    let (config, arch) = config(&file)?;
    let heads = config["num_attention_heads"].as_u64().unwrap_or(1) as usize;
    let kv_heads = config["num_key_value_heads"].as_u64().unwrap_or(1) as usize;
    let mut tensors = Vec::new();
    let mut quant = HashMap::new();
    let infos = file.tensors().to_vec();
    let total: usize = infos.iter().map(|t| t.n_bytes).sum();
    let mut done = 0;
    for info in &infos {
        done += info.n_bytes;
        let Some((base, suffix)) = info.name.rsplit_once('.') else {
            continue;
        };
        let Some(module) = module_name(base, &arch) else {
            bail!(
                "{}: GGUF tensor {:?} has no mapping to a {arch} checkpoint name",
                path.display(),
                info.name
            );
        };
        // q/k rows come back to the Hugging Face order on llama; qwen GGUFs are not permuted.
        let permute = match (arch.as_str(), base.rsplit('.').next()) {
            ("llama", Some("attn_q")) => Some(heads),
            ("llama", Some("attn_k")) => Some(kv_heads),
            _ => None,
        };
        let gemma_norm = arch == "gemma3" && base.ends_with("norm");
        let fix = |t: HostTensor| -> Result<HostTensor> {
            match permute {
                Some(h) => unpermute_rows(&t, h),
                None if gemma_norm => remove_unit_offset(&t),
                None => Ok(t),
            }
        };
        let affine = suffix == "weight" && info.shape.len() == 2 && affine_bits(info.ty).is_some();
        match affine {
            true => {
                let scale_dtype = if matches!(info.ty, GgmlType::Q4_K | GgmlType::Q5_K) {
                    DType::F32
                } else {
                    DType::F16
                };
                let a = file.to_mlx_affine(&info.name, scale_dtype)?;
                tensors.push((format!("{module}.weight"), fix(a.weight)?));
                tensors.push((format!("{module}.scales"), fix(a.scales)?));
                tensors.push((format!("{module}.biases"), fix(a.biases)?));
                quant.insert(
                    module,
                    QuantParams {
                        bits: a.bits,
                        group_size: a.group_size,
                    },
                );
            }
            false => {
                let dtype = match info.ty {
                    GgmlType::F32 => DType::F32,
                    GgmlType::BF16 => DType::BF16,
                    _ => DType::F16,
                };
                let t = file
                    .dequantize_as(&info.name, dtype)
                    .with_context(|| format!("reading {}", path.display()))?;
                tensors.push((format!("{module}.{suffix}"), fix(t)?));
            }
        }
        progress(done, total);
    }
    Ok(GgufModel {
        file,
        config,
        tensors,
        quant,
    })
}
