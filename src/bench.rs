//! `mlxcel bench`: prefill and decode throughput, one warm-up run then timed runs, as a table
//! (or one JSON object). Random-weight presets need no checkpoint: speed does not depend on
//! the values of the weights, only on their shapes and layout.

use anyhow::{bail, ensure, Context, Result};
use mlxcel_core::rng::SplitMix64;
use mlxcel_engine::{Engine, GenerateOptions, SamplerSettings};

use crate::cli::{BenchArgs, Global};

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn command(global: &Global, a: BenchArgs) -> Result<()> {
    ensure!(
        a.runs > 0 && a.prompt > 0 && a.max_tokens > 0,
        "--runs, --prompt and -n must be positive"
    );
    let (model, what) = match (&a.preset, &global.model) {
        (Some(_), Some(_)) => bail!("give either --preset or --model, not both"),
        (None, None) => bail!("bench needs --preset NAME or --model PATH"),
        (Some(p), None) => {
            let preset = mlxcel_models::synth::preset(p)?;
            eprintln!("building random weights for {p} ...");
            (
                mlxcel_models::synth::load(preset, 0)?,
                format!("preset {p} (random weights)"),
            )
        }
        (None, Some(m)) => (crate::progress::load_model(m)?, m.display().to_string()),
    };
    let backend = crate::backend(global.device)?;
    let device = backend.name();
    let dtype = crate::compute_dtype(&global.dtype, device)?;
    let vocab = model.spec.vocab as u64;
    let context = a.prompt + a.max_tokens;
    let mut engine = Engine::new(model, backend, dtype, Some(context.max(1)))?;
    let mut rng = SplitMix64(7);
    let prompt: Vec<u32> = (0..a.prompt).map(|_| rng.below(vocab) as u32).collect();
    let opts = GenerateOptions {
        max_tokens: a.max_tokens,
        sampler: SamplerSettings::default(),
        prefill_chunk: a.prefill_chunk,
    };
    let (mut prefill, mut decode) = (Vec::new(), Vec::new());
    for run in 0..=a.runs {
        let g = engine
            .generate(&prompt, &opts, &|_| false, |_| Ok(true))
            .context("bench run")?;
        if run > 0 {
            prefill.push(g.prompt_tps);
            decode.push(g.decode_tps);
        }
        eprintln!(
            "{} prefill {:.1} tok/s, decode {:.1} tok/s",
            if run == 0 { "warm-up:" } else { "run:    " },
            g.prompt_tps,
            g.decode_tps
        );
    }
    let (p, d) = (median(&mut prefill.clone()), median(&mut decode.clone()));
    let peak = crate::generate::peak_memory_bytes();
    if a.json {
        let obj = serde_json::json!({
            "model": what, "device": device, "dtype": dtype.name(), "prompt": a.prompt, "generated": a.max_tokens,
            "runs": a.runs, "prefill_tps": prefill, "decode_tps": decode, "prefill_tps_median": p,
            "decode_tps_median": d, "peak_host_memory_bytes": peak,
        });
        println!("{obj}");
    } else {
        println!(
            "| model | device | dtype | prompt | generated | prefill tok/s (median of {}) | decode tok/s |",
            a.runs
        );
        println!("|---|---|---|---|---|---|---|");
        println!(
            "| {what} | {device} | {} | {} | {} | {p:.1} | {d:.1} |",
            dtype.name(),
            a.prompt,
            a.max_tokens
        );
    }
    Ok(())
}
