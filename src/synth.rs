//! `mlxcel synth`: a preset's random weights written as an mlx-community-layout folder, so that
//! mlxcel (`-m DIR`), mlx-lm and other engines can be compared on the very weights
//! `mlxcel bench --preset` runs.

use std::path::Path;

use anyhow::{ensure, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

use crate::cli::SynthArgs;

/// Files a previous synth or convert may have left that would be loaded with the new ones
/// (mlx-lm loads every `model*.safetensors` it finds).
fn is_ours(name: &str) -> bool {
    (name.starts_with("model") && (name.ends_with(".safetensors") || name.ends_with(".safetensors.index.json")))
        || matches!(
            name,
            "config.json" | "tokenizer.json" | "tokenizer_config.json" | "generation_config.json"
        )
}

fn clear_out(out: &Path, force: bool) -> Result<()> {
    if !out.exists() {
        return Ok(());
    }
    ensure!(out.is_dir(), "--out {} exists and is not a folder", out.display());
    let entries: Vec<_> = std::fs::read_dir(out)
        .with_context(|| format!("reading {}", out.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    ensure!(
        entries.is_empty() || force,
        "--out {} is not empty ({} entries); pass --force to write into it",
        out.display(),
        entries.len()
    );
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if path.is_file() && is_ours(name) {
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    Ok(())
}

pub fn command(a: SynthArgs) -> Result<()> {
    let preset = mlxcel_models::synth::preset(&a.preset)?;
    clear_out(&a.out, a.force)?;
    let bar = ProgressBar::new(0);
    let mut phase = String::new();
    mlxcel_models::synth::save(preset, a.seed, &a.out, &mut |now, done, total| {
        if now != phase.as_str() {
            phase = now.to_string();
            let template = match now {
                "building" => "building random weights {bar:40} {pos}/{len} layers ({eta})",
                _ => "writing weights {bar:40} {bytes}/{total_bytes} ({eta})",
            };
            bar.set_style(ProgressStyle::with_template(template).expect("a valid template"));
            bar.reset();
        }
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })?;
    bar.finish_and_clear();
    let config = mlxcel_models::read_config(&a.out)?;
    let vocab = config["vocab_size"].as_u64().context("the preset has no vocab_size")? as usize;
    mlxcel_engine::byte_tokenizer::byte_level(vocab)?.save_folder_files(&a.out)?;
    let bytes: u64 = std::fs::read_dir(&a.out)?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
        .filter_map(|e| e.metadata().ok().map(|m| m.len()))
        .sum();
    eprintln!(
        "wrote {}: preset {} (seed {}), {:.1} MB of weights, byte-level tokenizer of {vocab} ids",
        a.out.display(),
        preset.name,
        a.seed,
        bytes as f64 / 1e6
    );
    Ok(())
}
