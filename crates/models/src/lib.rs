//! Checkpoints and architectures: a model folder (config.json + safetensors) becomes a
//! [`Transformer`] that builds step graphs. Quantization is decided by the loader per module,
//! not by model code.

pub mod checkpoint;
pub mod dtype_policy;
pub mod from_gguf;
pub mod gemma;
pub mod gguf;
pub mod layers;
pub mod llama;
pub mod moe;
pub mod quant;
pub mod qwen2;
pub mod qwen2_moe;
pub mod qwen3;
pub mod qwen3_moe;
pub mod synth;
pub mod transformer;
pub mod writer;

use std::path::Path;

use anyhow::{bail, Context, Result};

pub use dtype_policy::{DTypePlan, DTypePolicy};
pub use transformer::{DecoderSpec, PagedStep, StepInputs, Transformer};

type SpecFn = fn(&serde_json::Value) -> Result<DecoderSpec>;

/// Supported `model_type`s and how each reads its config.
pub const REGISTRY: &[(&str, SpecFn)] = &[
    ("llama", llama::spec),
    ("qwen2", qwen2::spec),
    ("qwen3", qwen3::spec),
    ("qwen2_moe", qwen2_moe::spec),
    ("qwen3_moe", qwen3_moe::spec),
    ("gemma2", gemma::gemma2_spec),
    ("gemma3_text", gemma::gemma3_text_spec),
    ("gemma3", gemma::gemma3_spec),
];

pub fn supported_types() -> Vec<&'static str> {
    REGISTRY.iter().map(|(name, _)| *name).collect()
}

/// Reads and parses `dir/config.json`.
pub fn read_config(dir: &Path) -> Result<serde_json::Value> {
    if dir.is_file() {
        bail!(
            "{} is a file: --model takes a model folder or a .gguf file",
            dir.display()
        );
    }
    if !dir.is_dir() {
        bail!("model folder {} does not exist", dir.display());
    }
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", path.display()))
}

/// The decoder spec for a parsed config, by its `model_type`.
pub fn spec_for(config: &serde_json::Value) -> Result<DecoderSpec> {
    let model_type = config["model_type"]
        .as_str()
        .context("config.json has no \"model_type\"")?;
    let Some((_, spec)) = REGISTRY.iter().find(|(name, _)| *name == model_type) else {
        bail!(
            "unknown model_type {model_type:?}; supported: {}",
            supported_types().join(", ")
        );
    };
    spec(config)
        .and_then(|spec| check_spec(&spec, config).map(|()| spec))
        .with_context(|| format!("reading the {model_type} config"))
}

/// What every architecture's config must satisfy beyond parsing: sizes that make a model, a
/// usable norm epsilon and context, the activation this engine runs for the family, and end
/// tokens inside the vocabulary.
fn check_spec(spec: &DecoderSpec, config: &serde_json::Value) -> Result<()> {
    for (key, v) in [
        ("hidden_size", spec.hidden),
        ("num_hidden_layers", spec.layers),
        ("head_dim", spec.head_dim),
        ("vocab_size", spec.vocab),
        ("max_position_embeddings", spec.max_position),
    ] {
        if v == 0 {
            bail!("config.json: {key} is 0");
        }
    }
    if !(spec.rms_eps.is_finite() && spec.rms_eps > 0.0) {
        bail!("config.json: rms_norm_eps {} is not a positive number", spec.rms_eps);
    }
    // Gemma checks its own GELU; every other family here runs SiLU.
    let act = config.get("hidden_act").and_then(|a| a.as_str());
    if let (Some(act), false) = (act, spec.model_type.starts_with("gemma")) {
        if act != "silu" {
            bail!(
                "config.json: hidden_act {act:?} is not supported for {} (silu)",
                spec.model_type
            );
        }
    }
    let eos: Vec<u64> = match &config["eos_token_id"] {
        serde_json::Value::Number(n) => n.as_u64().into_iter().collect(),
        serde_json::Value::Array(a) => a.iter().filter_map(|v| v.as_u64()).collect(),
        _ => vec![],
    };
    if let Some(bad) = eos.iter().find(|&&id| id >= spec.vocab as u64) {
        bail!(
            "config.json: eos_token_id {bad} is outside the vocabulary 0..{}",
            spec.vocab
        );
    }
    Ok(())
}

/// Loads the model in `dir`.
pub fn load(dir: &Path) -> Result<Transformer> {
    load_with_progress(dir, &mut |_, _| {})
}

/// Whether `path` names a GGUF file rather than a model folder.
pub fn is_gguf(path: &Path) -> bool {
    path.is_file() && path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// Loads the model in `path` (a folder, or a `.gguf` file), reporting `(bytes read, total)`
/// while the weights come in. Tensors stay as stored.
pub fn load_with_progress(path: &Path, progress: &mut dyn FnMut(usize, usize)) -> Result<Transformer> {
    let (spec, loader) = open(path, progress)?;
    let model = load_strictly(spec, &loader)?;
    loader.checkpoint.prefetch(progress);
    Ok(model)
}

/// Loads the model in `path` under the `--dtype` policy for the backend named `backend`:
/// floating tensors converted once here when the policy asks for it.
pub fn load_for(
    path: &Path,
    policy: DTypePolicy,
    backend: &str,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<(Transformer, DTypePlan)> {
    let (spec, loader) = open(path, progress)?;
    load_spec(spec, loader, policy, backend, progress)
}

/// `spec` read through `loader` under `policy` on `backend`.
pub fn load_spec(
    spec: DecoderSpec,
    mut loader: layers::Loader,
    policy: DTypePolicy,
    backend: &str,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<(Transformer, DTypePlan)> {
    let plan = dtype_policy::plan(policy, backend, &spec);
    loader.checkpoint.set_float_dtype(plan.tensors);
    let model = load_strictly(spec, &loader)?;
    if plan.tensors.is_none() {
        // Converting read every tensor already; tensors as stored are still only mapped.
        loader.checkpoint.prefetch(progress);
    }
    Ok((model, plan))
}

/// The model `spec` describes, from `loader`'s checkpoint, which must hold no tensor it leaves
/// unread ([`every_tensor_read`]).
fn load_strictly(spec: DecoderSpec, loader: &layers::Loader) -> Result<Transformer> {
    let model = Transformer::load(spec, loader)?;
    every_tensor_read(&model.spec, &loader.checkpoint)?;
    Ok(model)
}

/// Fails where the checkpoint holds tensors the model as its config describes it did not read
/// (mlx-lm loads strictly too): a wrong `num_hidden_layers`, a checkpoint of another
/// architecture, a merge gone wrong. Tensors every loader drops are allowed: precomputed
/// rotary frequencies, and in multimodal checkpoints whatever lies outside the text model's
/// prefix (vision tower, projector).
fn every_tensor_read(spec: &DecoderSpec, checkpoint: &checkpoint::Checkpoint) -> Result<()> {
    let prefix = &spec.options.weight_prefix;
    let extra: Vec<&str> = checkpoint
        .unread()
        .into_iter()
        .filter(|n| !n.ends_with("rotary_emb.inv_freq") && n.starts_with(prefix.as_str()))
        .collect();
    if extra.is_empty() {
        return Ok(());
    }
    let shown = extra.iter().take(4).copied().collect::<Vec<_>>().join(", ");
    let more = if extra.len() > 4 {
        format!(" and {} more", extra.len() - 4)
    } else {
        String::new()
    };
    bail!(
        "the checkpoint has {} tensors that the {} model its config describes (num_hidden_layers {}) \
         does not use: {shown}{more} (does the config match the weights?)",
        extra.len(),
        spec.model_type,
        spec.layers
    )
}

/// The spec and a loader for `path` (GGUF tensors are converted to MLX's layout here).
fn open(path: &Path, progress: &mut dyn FnMut(usize, usize)) -> Result<(DecoderSpec, layers::Loader)> {
    if is_gguf(path) {
        let g = from_gguf::read(path, progress)?;
        let spec = spec_for(&g.config)?;
        let loader = layers::Loader {
            checkpoint: checkpoint::Checkpoint::from_tensors(g.tensors),
            quant: quant::QuantConfig::from_modules(g.quant),
        };
        return Ok((spec, loader));
    }
    let config = read_config(path)?;
    let spec = spec_for(&config)?;
    let loader = layers::Loader {
        checkpoint: checkpoint::Checkpoint::open_dir(path)?,
        quant: quant::QuantConfig::from_config(&config)?,
    };
    Ok((spec, loader))
}
