//! `mlxcel convert`: a GGUF file or a safetensors model folder becomes a folder laid out as
//! mlx-community publishes them (config.json with mlx-lm's `quantization` block,
//! model.safetensors, tokenizer files), which both mlxcel and `mlx_lm.utils.load` read.
//!
//! By default nothing is lost: GGUF tensors keep the exact MLX affine forms and f16/f32 dense
//! tensors the GGUF reader gives (the ones mlxcel runs a GGUF with; f32 scales for Q4_K/Q5_K,
//! f16 for the rest, which mlx-lm takes module by module), and folder tensors are copied byte
//! for byte. `--quantize 4|8` requantizes every linear and embedding weight from its f32 value
//! with MLX's affine rule, scales and biases in bf16 as mlx-community stores them. That loses
//! accuracy on top of the source's own quantization: 12–30% perplexity on small models at 4-bit
//! group 64 (measured: +13.6% on SmolLM2-135M from its Q4_1 GGUF, see
//! docs/benchmark_results/convert-smollm2-mlx-lm.md; +12.5% on Qwen2.5-Coder-0.5B from Q4_K_M);
//! under 1% at 8 bits.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use mlxcel_core::quant::Quantized;
use mlxcel_core::tensor::Storage;
use mlxcel_core::{DType, HostTensor};
use mlxcel_engine::tokenizer::Tokenizer;
use mlxcel_models::checkpoint::Checkpoint;
use mlxcel_models::quant::{QuantConfig, QuantParams};
use serde_json::{json, Value};

use crate::cli::ConvertArgs;

/// Tokenizer and generation files a folder source may carry; each present one is copied.
const TOKENIZER_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
];

/// A model in checkpoint form: HF-style config, tensors under mlx-lm names, quantized modules.
struct Model {
    config: Value,
    tensors: Vec<(String, HostTensor)>,
    quant: HashMap<String, QuantParams>,
}

enum TokenizerSource {
    Built(Box<Tokenizer>),
    Folder(PathBuf),
    None(String),
}

pub fn command(args: ConvertArgs) -> Result<()> {
    let target = requested_quant(&args)?;
    ensure!(
        args.from.exists(),
        "--from {}: no such file or folder",
        args.from.display()
    );
    let gguf = mlxcel_models::is_gguf(&args.from);
    ensure!(
        gguf || args.from.is_dir(),
        "--from {}: expected a .gguf file or a model folder",
        args.from.display()
    );
    let stale = stale_outputs(&args.from, &args.out, args.force)?;

    let (mut model, tokenizer) = match gguf {
        true => read_gguf(&args.from)?,
        false => read_folder(&args.from)?,
    };
    mlxcel_models::spec_for(&model.config).with_context(|| format!("converting {}", args.from.display()))?;
    let kept = match target {
        Some(q) => requantize(&mut model, q)?,
        None => 0,
    };
    if let Some(obj) = model.config.as_object_mut() {
        obj.remove("quantization");
        obj.remove("quantization_config");
    }

    for path in stale {
        std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    }
    let total: usize = model.tensors.iter().map(|(_, t)| t.bytes().len()).sum();
    let bar = bar(total as u64, "writing weights {bar:40} {bytes}/{total_bytes} ({eta})");
    mlxcel_models::writer::save_folder_with_progress(
        &args.out,
        model.config,
        &model.tensors,
        &model.quant,
        &mut |done, _| bar.set_position(done as u64),
    )?;
    bar.finish_and_clear();
    let tokenizer_note = match tokenizer {
        TokenizerSource::Built(t) => t
            .save_folder_files(&args.out)
            .map(|_| "tokenizer from GGUF metadata".into())?,
        TokenizerSource::Folder(dir) => copy_tokenizer_files(&dir, &args.out)?,
        TokenizerSource::None(why) => format!("no tokenizer written ({why})"),
    };
    let mut summary = format!(
        "wrote {}: {} tensors, {} quantized modules, {:.1} MB; {tokenizer_note}",
        args.out.display(),
        model.tensors.len(),
        model.quant.len(),
        total as f64 / 1e6,
    );
    if kept > 0 {
        summary += &format!("; {kept} weights kept as they were (input size not a multiple of the group size)");
    }
    eprintln!("{summary}");
    Ok(())
}

/// `--quantize` / `--group-size`, validated.
fn requested_quant(args: &ConvertArgs) -> Result<Option<QuantParams>> {
    let Some(bits) = args.quantize else {
        ensure!(args.group_size.is_none(), "--group-size applies only with --quantize");
        return Ok(None);
    };
    ensure!(
        matches!(bits, 4 | 8),
        "--quantize {bits}: expected 4 or 8 (bits per weight)"
    );
    let group_size = args.group_size.unwrap_or(64);
    ensure!(
        matches!(group_size, 32 | 64 | 128),
        "--group-size {group_size}: expected 32, 64 or 128"
    );
    Ok(Some(QuantParams { bits, group_size }))
}

/// An existing non-empty `out` is refused without `force`; with it, the weight and tokenizer
/// files a previous conversion left there are returned, to be removed once the source has been
/// read, so that no stale shard is loaded with the new ones.
fn stale_outputs(from: &Path, out: &Path, force: bool) -> Result<Vec<PathBuf>> {
    if !out.exists() {
        return Ok(Vec::new());
    }
    ensure!(out.is_dir(), "--out {} exists and is not a folder", out.display());
    if let (Ok(a), Ok(b)) = (from.canonicalize(), out.canonicalize()) {
        ensure!(
            a != b,
            "--out {} is the --from folder; write somewhere else",
            out.display()
        );
    }
    let entries: Vec<PathBuf> = std::fs::read_dir(out)
        .with_context(|| format!("reading {}", out.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    ensure!(
        entries.is_empty() || force,
        "--out {} is not empty ({} entries); pass --force to write into it",
        out.display(),
        entries.len()
    );
    let ours = |p: &PathBuf| {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let weights =
            name.starts_with("model") && (name.ends_with(".safetensors") || name.ends_with(".safetensors.index.json"));
        p.is_file() && (weights || name == "config.json" || TOKENIZER_FILES.contains(&name))
    };
    Ok(entries.into_iter().filter(ours).collect())
}

fn bar(len: u64, template: &str) -> ProgressBar {
    let b = ProgressBar::new(len);
    b.set_style(ProgressStyle::with_template(template).expect("a valid template"));
    b
}

fn read_gguf(path: &Path) -> Result<(Model, TokenizerSource)> {
    let bar = bar(0, "reading GGUF {bar:40} {bytes}/{total_bytes} ({eta})");
    let g = mlxcel_models::from_gguf::read(path, &mut |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })?;
    bar.finish_and_clear();
    let tokenizer = match mlxcel_engine::gguf_tokenizer::from_gguf(&g.file) {
        Ok(t) => TokenizerSource::Built(Box::new(t)),
        Err(e) => TokenizerSource::None(format!("{e:#}")),
    };
    let mut model = Model {
        config: g.config,
        tensors: g.tensors,
        quant: g.quant,
    };
    complete_gguf_config(&mut model, &tokenizer);
    Ok((model, tokenizer))
}

/// Fields mlx-lm reads that the GGUF reader leaves to defaults. mlx-lm's defaults differ from
/// Hugging Face's in places (its llama defaults `tie_word_embeddings` to true), so each is
/// written out. `rope_traditional` is false: the reader already put q/k rows back in the
/// Hugging Face half-split order.
fn complete_gguf_config(model: &mut Model, tokenizer: &TokenizerSource) {
    let has = |name: &str| model.tensors.iter().any(|(n, _)| n == name);
    let attention_bias = has("model.layers.0.self_attn.q_proj.bias");
    let c = &mut model.config;
    let architecture = match c["model_type"].as_str() {
        Some("llama") => "LlamaForCausalLM",
        Some("qwen2") => "Qwen2ForCausalLM",
        Some("qwen3") => "Qwen3ForCausalLM",
        _ => "",
    };
    c["architectures"] = json!([architecture]);
    c["hidden_act"] = json!("silu");
    c["rope_traditional"] = json!(false);
    c["attention_bias"] = json!(attention_bias);
    c["mlp_bias"] = json!(false);
    // mlx-lm stops on config.json's eos ids; the GGUF's end-of-turn ids belong there too.
    if let TokenizerSource::Built(t) = tokenizer {
        if t.eos_ids().len() > 1 {
            c["eos_token_id"] = json!(t.eos_ids());
        }
    }
}

fn read_folder(dir: &Path) -> Result<(Model, TokenizerSource)> {
    let mut config = mlxcel_models::read_config(dir)?;
    let quant_config = QuantConfig::from_config(&config)?;
    let ck = Checkpoint::open_dir(dir)?;
    let mut names: Vec<&str> = ck.names().collect();
    names.sort_unstable();
    let tensors = names
        .iter()
        .map(|&n| Ok((n.to_string(), ck.get(n)?)))
        .collect::<Result<Vec<_>>>()?;
    let mut quant = HashMap::new();
    for module in names.iter().filter_map(|n| n.strip_suffix(".scales")) {
        let q = quant_config.for_module(module).with_context(|| {
            format!(
                "{}: {module} is stored quantized but config.json gives it no quantization parameters",
                dir.display()
            )
        })?;
        quant.insert(module.to_string(), q);
    }
    // mlx-lm ties by default and drops lm_head when tied; mlxcel uses an lm_head when one is
    // stored. Saying which one holds keeps the two engines on the same weights.
    let has_head = ck.contains("lm_head.weight");
    if has_head || config.get("tie_word_embeddings").is_none() {
        config["tie_word_embeddings"] = json!(!has_head);
    }
    let tokenizer = match dir.join("tokenizer.json").is_file() {
        true => TokenizerSource::Folder(dir.to_path_buf()),
        false => TokenizerSource::None(format!("{} has no tokenizer.json", dir.display())),
    };
    Ok((Model { config, tensors, quant }, tokenizer))
}

fn copy_tokenizer_files(from: &Path, to: &Path) -> Result<String> {
    let mut copied = Vec::new();
    for name in TOKENIZER_FILES {
        let src = from.join(name);
        if src.is_file() {
            std::fs::copy(&src, to.join(name)).with_context(|| format!("copying {}", src.display()))?;
            copied.push(*name);
        }
    }
    Ok(format!("copied {}", copied.join(", ")))
}

/// Requantizes every 2-D weight whose input size the group divides; returns how many were left
/// as they were.
fn requantize(model: &mut Model, q: QuantParams) -> Result<usize> {
    let mut tensors: HashMap<String, HostTensor> = std::mem::take(&mut model.tensors).into_iter().collect();
    let mut modules: Vec<String> = tensors
        .iter()
        .filter(|(_, t)| t.shape.len() == 2)
        .filter_map(|(n, _)| n.strip_suffix(".weight").map(str::to_string))
        .collect();
    modules.sort();
    let bar = bar(
        modules.len() as u64,
        "requantizing {bar:40} {pos}/{len} weights ({eta})",
    );
    let mut kept = 0;
    for module in modules {
        bar.inc(1);
        let (rows, cols, values) = values_of(&tensors, &module, model.quant.get(&module).copied())?;
        if !cols.is_multiple_of(q.group_size) {
            kept += 1;
            continue;
        }
        let out = quantize_rows(&values, rows, cols, q);
        let groups = [rows, cols / q.group_size];
        let words: Vec<u8> = out.packed.iter().flat_map(|w| w.to_le_bytes()).collect();
        let packed = [rows, cols * q.bits as usize / 32];
        let weight = HostTensor::from_bytes(DType::U32, packed.to_vec(), Storage::from_vec(words))?;
        tensors.insert(format!("{module}.weight"), weight);
        tensors.insert(
            format!("{module}.scales"),
            HostTensor::from_f32(DType::BF16, &groups, &out.scales)?,
        );
        tensors.insert(
            format!("{module}.biases"),
            HostTensor::from_f32(DType::BF16, &groups, &out.biases)?,
        );
        model.quant.insert(module, q);
    }
    bar.finish_and_clear();
    model.tensors = tensors.into_iter().collect();
    Ok(kept)
}

/// `(rows, cols, values)` of the matrix `module.weight` stands for, dequantized if `params` say
/// it is stored quantized.
fn values_of(
    tensors: &HashMap<String, HostTensor>,
    module: &str,
    params: Option<QuantParams>,
) -> Result<(usize, usize, Vec<f32>)> {
    let get = |suffix: &str| {
        tensors
            .get(&format!("{module}.{suffix}"))
            .with_context(|| format!("{module} is quantized but has no {suffix}"))
    };
    let weight = get("weight")?;
    let Some(p) = params else {
        return Ok((weight.shape[0], weight.shape[1], weight.to_f32_vec()));
    };
    let (rows, cols) = (weight.shape[0], weight.shape[1] * 32 / p.bits as usize);
    let source = Quantized {
        packed: weight.to_vec::<u32>()?,
        scales: get("scales")?.to_f32_vec(),
        biases: get("biases")?.to_f32_vec(),
        rows,
        cols,
        bits: p.bits,
        group_size: p.group_size,
    };
    Ok((rows, cols, source.dequantize()))
}

/// `w [rows, cols]` quantized with MLX's rule (`mlxcel_core::quant::quantize`), over blocks of
/// rows on every core (rows quantize independently).
fn quantize_rows(w: &[f32], rows: usize, cols: usize, q: QuantParams) -> Quantized {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let block = rows.div_ceil(threads).max(1);
    let parts: Vec<Quantized> = std::thread::scope(|s| {
        let handles: Vec<_> = w
            .chunks(block * cols)
            .map(|chunk| s.spawn(move || quantize_block(chunk, chunk.len() / cols, cols, q)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("quantizer thread"))
            .collect()
    });
    let mut all = Quantized {
        packed: Vec::new(),
        scales: Vec::new(),
        biases: Vec::new(),
        rows,
        cols,
        bits: q.bits,
        group_size: q.group_size,
    };
    for p in parts {
        all.packed.extend(p.packed);
        all.scales.extend(p.scales);
        all.biases.extend(p.biases);
    }
    all
}

fn quantize_block(w: &[f32], rows: usize, cols: usize, q: QuantParams) -> Quantized {
    mlxcel_core::quant::quantize(w, rows, cols, q.bits, q.group_size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_blocks_quantize_like_one_block() {
        let mut rng = mlxcel_core::rng::SplitMix64(9);
        let (rows, cols) = (37, 128);
        let w = rng.signed_vec(rows * cols, 1.0);
        let q = QuantParams {
            bits: 4,
            group_size: 32,
        };
        let one = quantize_block(&w, rows, cols, q);
        let blocks = quantize_rows(&w, rows, cols, q);
        assert_eq!(one.packed, blocks.packed);
        assert_eq!(one.scales, blocks.scales);
        assert_eq!(one.biases, blocks.biases);
    }

    #[test]
    fn zero_stays_zero_and_every_weight_is_within_a_step() {
        let mut rng = mlxcel_core::rng::SplitMix64(3);
        for bits in [4, 8] {
            let mut w = rng.signed_vec(4 * 64, 0.1);
            w[5] = 0.0;
            let q = quantize_rows(&w, 4, 64, QuantParams { bits, group_size: 32 });
            let back = q.dequantize();
            assert!(back[5].abs() <= 1e-6 * q.scales[0].abs(), "{bits}-bit: zero stays zero");
            // The nudged scale can fall short of the far extreme by up to one step.
            for (i, (a, b)) in w.iter().zip(&back).enumerate() {
                let step = q.scales[i / 32].abs();
                assert!((a - b).abs() <= step * 1.0001, "{bits}-bit element {i}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn bad_settings_are_refused_before_any_work() {
        let args = |quantize, group_size| ConvertArgs {
            from: "x".into(),
            out: "y".into(),
            quantize,
            group_size,
            force: false,
        };
        for (a, needle) in [
            (args(Some(3), None), "--quantize 3"),
            (args(Some(4), Some(48)), "--group-size 48"),
            (args(None, Some(64)), "only with --quantize"),
        ] {
            let e = requested_quant(&a).unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
        assert_eq!(
            requested_quant(&args(Some(8), None)).unwrap(),
            Some(QuantParams {
                bits: 8,
                group_size: 64
            })
        );
    }
}
