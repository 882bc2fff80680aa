//! `mlxcel bench` and `mlxcel synth` on the smallest preset: flags, output fields, folders that
//! load, and bad input as one clear error.

use std::path::PathBuf;
use std::process::{Command, Output};

const TINY: &str = "tiny-qwen3-4bit";

fn mlxcel(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mlxcel"))
        .args(args)
        .output()
        .expect("mlxcel runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ok(args: &[&str]) -> String {
    let o = mlxcel(args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    String::from_utf8(o.stdout).unwrap()
}

fn json(args: &[&str]) -> serde_json::Value {
    let out = ok(args);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

fn fails_with(args: &[&str], needle: &str) {
    let o = mlxcel(args);
    assert!(!o.status.success(), "{args:?} should fail");
    let e = stderr(&o);
    assert!(e.starts_with("mlxcel: error:") && e.contains(needle), "{args:?}: {e}");
    assert_eq!(e.trim_end().lines().count(), 1, "{args:?}: one line: {e}");
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mlxcel-bench-{tag}-{}", std::process::id()));
    std::fs::remove_dir_all(&d).ok();
    d
}

#[test]
fn bench_json_has_every_figure_and_they_are_numbers() {
    let j = json(&["bench", "--preset", TINY, "-p", "8", "-g", "4", "-r", "2", "--json"]);
    assert_eq!(
        (j["device"].as_str(), j["prompt"].as_u64(), j["gen"].as_u64()),
        (Some("cpu"), Some(8), Some(4))
    );
    for key in [
        "prefill_tps_mean",
        "prefill_tps_std",
        "decode_tps_mean",
        "decode_tps_std",
        "ms_per_token_mean",
        "ms_per_token_std",
        "bytes_per_token",
        "weight_bytes_per_token",
        "achieved_gbps_mean",
        "copy_gbps",
        "bandwidth_share",
        "peak_memory_bytes",
        "session_bytes",
    ] {
        let v = j[key].as_f64().unwrap_or_else(|| panic!("{key} is not a number: {j}"));
        assert!(v.is_finite() && v >= 0.0, "{key} = {v}");
    }
    assert!(j["decode_tps_mean"].as_f64().unwrap() > 0.0);
    assert_eq!(j["decode_tps"].as_array().unwrap().len(), 2, "one figure per timed run");
    // Tied 4-bit weights, all read each token; the KV cache adds 1 KiB per position at the mean
    // context of 8 + 4/2 (k and v, 2 layers, 2 heads of 32 f32).
    let weights = j["weight_bytes_per_token"].as_f64().unwrap();
    assert_eq!(j["parameter_bytes"].as_f64().unwrap(), weights);
    assert_eq!(j["bytes_per_token"].as_f64().unwrap(), weights + 10.0 * 1024.0);
    let share = j["bandwidth_share"].as_f64().unwrap();
    let ratio = j["achieved_gbps_mean"].as_f64().unwrap() / j["copy_gbps"].as_f64().unwrap();
    assert!((share - ratio).abs() <= 1e-9 * ratio.max(1.0), "{share} vs {ratio}");
}

#[test]
fn bench_prints_a_table_and_keeps_the_old_flag_spellings() {
    let out = ok(&["bench", "--preset", TINY, "--prompt", "4", "-n", "2", "--runs", "1"]);
    let header = out.lines().next().unwrap();
    for column in [
        "prefill tok/s",
        "decode tok/s",
        "ms/token",
        "read/token",
        "GB/s",
        "of copy BW",
        "peak memory",
    ] {
        assert!(header.contains(column), "{column}: {out}");
    }
    assert!(
        out.lines().nth(2).unwrap().starts_with(&format!("| {TINY} | cpu |")),
        "{out}"
    );
    ok(&[
        "bench",
        "--preset",
        TINY,
        "-p",
        "4",
        "--max-tokens",
        "2",
        "-r",
        "1",
        "--json",
    ]);
    let presets = ok(&["bench", "--list-presets"]);
    for p in ["llama-3.1-8b-4bit", "qwen3-8b-4bit", "qwen2.5-0.5b-bf16", TINY] {
        assert!(presets.lines().any(|l| l == p), "{p}: {presets}");
    }
}

#[test]
fn graph_only_on_cuda_counts_the_launches_after_fusion() {
    let args = ["bench", "--preset", TINY, "--graph-only", "--device", "cuda", "--json"];
    let fused = json(&args);
    if !cfg!(feature = "cuda") {
        assert!(
            fused["launches_per_step"].is_null(),
            "no fusion to ask without CUDA: {fused}"
        );
        return;
    }
    let nodes = fused["nodes_per_step"].as_u64().unwrap();
    let launches = fused["launches_per_step"].as_u64().expect("launches_per_step");
    assert!(launches > 0 && launches < nodes, "{fused}");
    // The same launches by kernel family: they add up, and the step's one attention a layer
    // and its fused products are named.
    let families = fused["launches_by_family"].as_array().expect("launches_by_family");
    let sum: u64 = families.iter().map(|f| f["launches"].as_u64().unwrap()).sum();
    assert_eq!(sum, launches, "{fused}");
    let named = |what: &str| families.iter().any(|f| f["kernel"].as_str().unwrap().starts_with(what));
    assert!(named("attention") && named("fused"), "{fused}");
    // Without fusion every computing node launches on its own.
    let o = Command::new(env!("CARGO_BIN_EXE_mlxcel"))
        .args(args)
        .env("MLXCEL_CUDA_FUSE", "0")
        .output()
        .unwrap();
    let plain: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        plain["launches_per_step"].as_u64().unwrap() > launches,
        "{plain} vs {fused}"
    );
}

/// The decode launches of a parity fixture's model on CUDA (graph-only), by kernel family.
fn fixture_families(case: &str) -> Vec<(String, u64)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/parity")
        .join(case);
    let j = json(&[
        "bench",
        "--model",
        dir.to_str().unwrap(),
        "--graph-only",
        "--device",
        "cuda",
        "--json",
    ]);
    let families = j["launches_by_family"].as_array().expect("launches_by_family");
    families
        .iter()
        .map(|f| {
            (
                f["kernel"].as_str().unwrap().to_string(),
                f["launches"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn graph_only_shows_biases_and_sandwich_norms_folded_into_the_products() {
    if !cfg!(feature = "cuda") {
        return;
    }
    // Qwen2's q/k/v biases: added by the fused products' launch, no add of their own.
    let qwen2 = fixture_families("qwen2-bias-tied-bf16");
    assert!(qwen2.iter().any(|(k, _)| k.contains("3 products+bias")), "{qwen2:?}");
    assert!(
        !qwen2
            .iter()
            .any(|(k, _)| k.starts_with("add f16") || k.starts_with("add bf16")),
        "{qwen2:?}"
    );
    // Gemma 3's post-attention and post-feed-forward norms: inside the GEMV after the residual
    // add; at most the first layer's input norm and the last layer's post-feed-forward norm
    // (whose add + norm feeds the LM head) run alone, of five layers' ten.
    let gemma = fixture_families("gemma3-text-bf16");
    assert!(
        gemma.iter().any(|(k, _)| k.starts_with("fused rms_norm+add+rms_norm+")),
        "{gemma:?}"
    );
    let alone: u64 = gemma
        .iter()
        .filter(|(k, _)| k.starts_with("rms_norm"))
        .map(|(_, n)| n)
        .sum();
    assert!(alone <= 2, "{alone} RMSNorms launched alone: {gemma:?}");
}

#[test]
fn graph_only_counts_the_batched_serve_step() {
    let base = [
        "bench",
        "--preset",
        TINY,
        "--graph-only",
        "--device",
        "cuda",
        "--json",
        "-p",
        "20",
        "-g",
        "12",
    ];
    let count = |batch: &str| {
        let j = json(&[&base[..], &["--batch", batch]].concat());
        (j["nodes_per_step"].as_u64().unwrap(), j["launches_per_step"].as_u64())
    };
    let (one, four) = (count("1"), count("4"));
    // More rows never make the step smaller; the single-sequence step is not the paged one.
    let single = json(&base);
    assert!(
        four.0 >= one.0 && one.0 > 0,
        "nodes: batch 4 {four:?} against batch 1 {one:?}"
    );
    assert_ne!(
        single["nodes_per_step"].as_u64().unwrap(),
        one.0,
        "the paged step is its own graph"
    );
    if cfg!(feature = "cuda") {
        assert!(
            four.1.unwrap() >= one.1.unwrap() && one.1.unwrap() > 0,
            "launches: {four:?} against {one:?}"
        );
    }
}

#[test]
fn batch_times_the_batched_step() {
    let j = json(&[
        "bench", "--preset", TINY, "--batch", "3", "-p", "5", "-g", "4", "-r", "1", "--json",
    ]);
    assert_eq!(j["batch"].as_u64(), Some(3), "{j}");
    let agg = j["aggregate_tps_mean"].as_f64().unwrap();
    assert!(agg > 0.0 && agg.is_finite(), "{j}");
    let per_row = j["row_tps_mean"].as_f64().unwrap();
    assert!((per_row * 3.0 - agg).abs() < 1e-6 * agg, "{j}");
}

#[test]
fn bad_bench_flags_are_one_clear_error() {
    fails_with(&["bench", "--preset", TINY, "-p", "0"], "-p/--prompt 0");
    fails_with(&["bench", "--preset", TINY, "-g", "0"], "-g/--gen 0");
    fails_with(&["bench", "--preset", TINY, "-r", "0"], "-r/--runs 0");
    fails_with(&["bench", "--preset", "gpt-9"], "unknown preset \"gpt-9\"");
    fails_with(&["bench", "-m", "/no/such/model"], "does not exist");
    fails_with(
        &["bench", "--preset", TINY, "--graph-only", "--batch", "0"],
        "--batch 0",
    );
    assert_eq!(
        mlxcel(&["bench", "-p", "x"]).status.code(),
        Some(2),
        "clap rejects a non-number"
    );
}

#[test]
fn a_synth_folder_loads_in_mlxcel_and_depends_only_on_the_seed() {
    let (a, b, c) = (scratch("a"), scratch("b"), scratch("c"));
    for (dir, seed) in [(&a, "0"), (&b, "0"), (&c, "1")] {
        ok(&[
            "synth",
            "--preset",
            TINY,
            "--out",
            dir.to_str().unwrap(),
            "--seed",
            seed,
        ]);
    }
    let weights = |d: &PathBuf| std::fs::read(d.join("model.safetensors")).unwrap();
    assert!(weights(&a) == weights(&b), "one seed, one model");
    assert!(weights(&a) != weights(&c), "another seed, other weights");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(a.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["quantization"]["bits"], 4);
    assert_eq!(config["quantization"]["group_size"], 32);
    assert_eq!(config["model_type"], "qwen3");

    let dir = a.to_str().unwrap();
    // The byte-level tokenizer: text becomes its bytes.
    let g = json(&["-m", dir, "generate", "hi!", "-n", "3", "--json"]);
    assert_eq!(g["prompt_tokens"], serde_json::json!([104, 105, 33]));
    assert_eq!(g["tokens"].as_array().unwrap().len(), 3);
    let j = json(&["-m", dir, "bench", "-p", "4", "-g", "2", "-r", "1", "--json"]);
    assert_eq!(j["model"], dir);
    // The folder and the preset hold the same bytes, so they read the same per token.
    let p = json(&["bench", "--preset", TINY, "-p", "4", "-g", "2", "-r", "1", "--json"]);
    assert_eq!(j["bytes_per_token"], p["bytes_per_token"]);

    fails_with(&["synth", "--preset", TINY, "--out", dir], "pass --force");
    ok(&["synth", "--preset", TINY, "--out", dir, "--seed", "1", "--force"]);
    assert!(weights(&a) == weights(&c), "--force replaces the weights");
    for d in [a, b, c] {
        std::fs::remove_dir_all(d).ok();
    }
}

#[test]
fn bad_synth_input_is_one_clear_error() {
    let d = scratch("bad");
    fails_with(
        &["synth", "--preset", "gpt-9", "--out", d.to_str().unwrap()],
        "unknown preset \"gpt-9\"",
    );
    assert!(!d.exists(), "nothing written for a bad preset");
    let file = std::env::temp_dir().join(format!("mlxcel-bench-file-{}", std::process::id()));
    std::fs::write(&file, b"x").unwrap();
    fails_with(
        &["synth", "--preset", TINY, "--out", file.to_str().unwrap()],
        "not a folder",
    );
    std::fs::remove_file(&file).ok();
    assert_eq!(
        mlxcel(&["synth", "--preset", TINY]).status.code(),
        Some(2),
        "--out is required"
    );
}
