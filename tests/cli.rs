//! The command line: the demo runs end to end, and bad input exits non-zero with one clear line.

use std::process::{Command, Output};

fn mlxcel(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mlxcel"))
        .args(args)
        .output()
        .expect("mlxcel runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn demo_generates_tokens_and_reports_the_decode_graph() {
    let o = mlxcel(&["demo", "--device", "cpu", "-n", "5", "--layers", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let generated = out
        .lines()
        .find(|l| l.starts_with("generated:"))
        .expect("a generated line");
    assert_eq!(generated.matches(',').count(), 4, "five tokens: {generated}");
    assert!(stderr(&o).contains("AsType per step"), "{}", stderr(&o));
}

#[test]
fn demo_writes_the_decode_graph_as_dot() {
    let path = std::env::temp_dir().join(format!("mlxcel-demo-{}.dot", std::process::id()));
    let o = mlxcel(&[
        "demo",
        "-n",
        "2",
        "--layers",
        "1",
        "--export-dot",
        path.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let dot = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).ok();
    assert!(dot.starts_with("digraph") && dot.contains("attention"), "{dot}");
}

#[test]
fn bad_input_is_one_clear_error() {
    for (args, needle) in [
        (&["demo", "--activations", "int8"][..], "--activations int8"),
        (&["demo", "--prompt-tokens", "1,x"][..], "bad token id"),
        (&["demo", "--prompt-tokens", "99999"][..], "outside the vocabulary"),
        (&["demo", "--heads", "3"][..], "--dim 128 must split into --heads 3"),
        (
            &["demo", "--kv-heads", "3"][..],
            "--heads 4 must be a multiple of --kv-heads 3",
        ),
        (&["demo", "--dim", "100"][..], "--dim 100 must be a multiple of"),
        (
            &["demo", "--layers", "100000000"][..],
            "--layers 100000000: must be 1 to 32",
        ),
        (&["demo", "--steps", "0"][..], "--steps 0: must be 1 to"),
        (&["demo", "--vocab", "0"][..], "--vocab 0: must be 1 to"),
        (&["demo", "--device", "cuda"][..], "CUDA"),
    ] {
        let o = mlxcel(args);
        assert!(!o.status.success(), "{args:?} should fail");
        let e = stderr(&o);
        assert!(e.starts_with("mlxcel: error:") && e.contains(needle), "{args:?}: {e}");
        assert!(!e.contains("panicked"), "{args:?}: {e}");
    }
    let o = mlxcel(&["demo", "--no-such-flag"]);
    assert_eq!(o.status.code(), Some(2), "clap rejects unknown flags");
}

fn fixture(case: &str) -> String {
    format!("{}/tests/fixtures/parity/{case}", env!("CARGO_MANIFEST_DIR"))
}

/// A scratch copy of a fixture folder that a test may break.
fn scratch_copy(case: &str, tag: &str) -> std::path::PathBuf {
    let dst = std::env::temp_dir().join(format!("mlxcel-cli-{tag}-{}", std::process::id()));
    std::fs::remove_dir_all(&dst).ok();
    std::fs::create_dir_all(&dst).unwrap();
    for entry in std::fs::read_dir(fixture(case)).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
    }
    dst
}

fn json_out(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", stderr(o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {:?}", o.stdout))
}

#[test]
fn generate_streams_text_and_reports_stats() {
    let m = fixture("llama-bf16");
    let o = mlxcel(&["--model", &m, "generate", "Tell me a story", "-n", "8"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("tok/s") && e.contains("peak memory"), "{e}");
    // The same run, the other spelling, as JSON.
    let j = json_out(&mlxcel(&[
        "generate",
        "-m",
        &m,
        "-p",
        "Tell me a story",
        "-n",
        "8",
        "--json",
    ]));
    for key in [
        "prompt_tokens",
        "tokens",
        "text",
        "finish_reason",
        "prompt_tps",
        "decode_tps",
        "peak_memory_bytes",
    ] {
        assert!(j.get(key).is_some(), "missing {key} in {j}");
    }
    assert!(j["finish_reason"] == "length" || j["finish_reason"] == "stop");
    assert_eq!(
        j["prompt_tokens"][0], 507,
        "the chat template starts with <|begin_of_text|>"
    );
    let streamed = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        streamed.trim_end_matches('\n'),
        j["text"].as_str().unwrap(),
        "streamed text equals the JSON text"
    );
}

#[test]
fn prompt_tokens_are_used_exactly_as_given() {
    let m = fixture("llama-bf16");
    let j = json_out(&mlxcel(&[
        "-m",
        &m,
        "generate",
        "--prompt-tokens",
        "5,6,7",
        "-n",
        "3",
        "--json",
    ]));
    assert_eq!(j["prompt_tokens"], serde_json::json!([5, 6, 7]));
    let raw = json_out(&mlxcel(&[
        "-m",
        &m,
        "generate",
        "hi",
        "--no-chat-template",
        "-n",
        "1",
        "--json",
    ]));
    assert_eq!(
        raw["prompt_tokens"][0], 507,
        "raw prompts get BOS (add_bos) but no template"
    );
    assert_ne!(
        raw["prompt_tokens"][1], 509,
        "no <|start_header_id|> without the template"
    );
}

#[test]
fn perplexity_json_has_one_nll_per_predicted_token() {
    let m = fixture("qwen3-q4g64");
    let j = json_out(&mlxcel(&[
        "perplexity",
        "--model",
        &m,
        "--tokens",
        "1,2,3,4,5",
        "--json",
    ]));
    assert_eq!(j["tokens"], serde_json::json!([1, 2, 3, 4, 5]));
    let nll: Vec<f64> = j["nll"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(nll.len(), 4);
    let mean = nll.iter().sum::<f64>() / 4.0;
    assert!((j["mean_nll"].as_f64().unwrap() - mean).abs() < 1e-9);
    assert!((j["ppl"].as_f64().unwrap() - mean.exp()).abs() < 1e-6);
    let path = std::env::temp_dir().join(format!("mlxcel-ppl-{}.txt", std::process::id()));
    std::fs::write(&path, "The quick brown fox.").unwrap();
    let t = json_out(&mlxcel(&[
        "-m",
        &fixture("llama-bf16"),
        "perplexity",
        "--file",
        path.to_str().unwrap(),
        "--json",
    ]));
    std::fs::remove_file(&path).ok();
    assert_eq!(t["tokens"][0], 507, "add_bos_token asks for BOS");
}

fn fails_with(args: &[&str], needle: &str) {
    let o = mlxcel(args);
    let e = stderr(&o);
    assert!(!o.status.success(), "{args:?} should fail; stderr: {e}");
    assert!(e.contains(needle), "{args:?}: expected {needle:?} in: {e}");
    assert!(!e.contains("panicked"), "{args:?}: {e}");
}

#[test]
fn bad_models_and_flags_fail_cleanly() {
    let m = fixture("llama-bf16");
    let q = fixture("qwen3-q4g64");
    fails_with(&["-m", "/no/such/dir", "generate", "hi"], "does not exist");
    fails_with(&["generate", "hi"], "--model is required");
    fails_with(&["-m", &q, "generate", "hi"], "tokenizer.json");
    fails_with(&["-m", &m, "generate", "a", "-p", "b"], "not both");
    fails_with(&["-m", &m, "generate", "-p", "a", "--prompt-tokens", "1"], "not both");
    fails_with(&["-m", &m, "generate", "-p", ""], "empty");
    fails_with(&["-m", &m, "generate"], "no prompt");
    fails_with(&["-m", &m, "generate", "--prompt-tokens", "1,-2"], "negative");
    fails_with(
        &["-m", &m, "generate", "--prompt-tokens", "1,99999"],
        "outside the vocabulary",
    );
    fails_with(&["-m", &m, "generate", "hi", "--temp=-1"], "--temp");
    fails_with(&["-m", &m, "generate", "hi", "--top-p", "0"], "--top-p");
    fails_with(
        &["-m", &m, "--dtype", "int4", "generate", "hi"],
        "is not one of auto, native",
    );
    fails_with(
        &[
            "-m",
            &m,
            "generate",
            "--prompt-tokens",
            "1,2,3,4,5,6",
            "--max-context",
            "4",
        ],
        "the prompt (6 tokens) leaves no room to generate in the context of 4 tokens",
    );
    fails_with(
        &["-m", &m, "generate", "hi", "-n", "10", "--max-context", "25"],
        "exceeds the context",
    );
    fails_with(&["-m", &m, "perplexity", "--tokens", "1"], "at least two tokens");
    fails_with(&["-m", &m, "perplexity", "--tokens", "1,2", "--file", "x"], "not both");
    fails_with(&["-m", &m, "perplexity"], "--tokens or --file");
    for flag in [
        "--max-prefill-tokens",
        "--max-step-graphs",
        "--prefill-chunk",
        "--max-body-bytes",
        "--max-context",
    ] {
        fails_with(
            &["-m", &m, "serve", "--port", "0", flag, "0"],
            &format!("{flag} 0: must be at least 1"),
        );
    }
    fails_with(
        &["-m", &m, "serve", "--port", "0", "--block-size", "100000000"],
        "--block-size 100000000 is larger than the KV cache",
    );
    fails_with(
        &["-m", &m, "bench", "-p", "250", "-g", "20", "-r", "1"],
        "-p 250 plus -g 20 exceeds the model's context of 256 positions",
    );
    fails_with(
        &["-m", &m, "bench", "--batch", "100000000"],
        "--batch 100000000: must be 1 to",
    );
    fails_with(
        &["-m", &m, "bench", "--seed", "5"],
        "--seed picks a --preset's random weights",
    );
    fails_with(
        &["-m", &format!("{m}/config.json"), "generate", "hi"],
        "is a file: --model takes",
    );
    fails_with(
        &["-m", &m, "generate", "hi", "--max-context", "2"],
        "leaves no room to generate",
    );
    fails_with(
        &["-m", &m, "--dump-graph", "/no/such/dir/x.dot", "generate", "hi"],
        "does not exist",
    );
    let empty = std::env::temp_dir().join(format!("mlxcel-cli-empty-{}.txt", std::process::id()));
    std::fs::write(&empty, "").unwrap();
    fails_with(
        &["-m", &m, "perplexity", "--file", empty.to_str().unwrap()],
        "perplexity needs at least two",
    );
    std::fs::remove_file(&empty).ok();
}

/// A scratch copy of the llama fixture whose config.json has `key` set to `value`.
fn with_config(key: &str, value: serde_json::Value) -> std::path::PathBuf {
    let d = scratch_copy("llama-bf16", &format!("cfg-{key}"));
    let path = d.join("config.json");
    let mut c: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    c[key] = value;
    std::fs::write(&path, c.to_string()).unwrap();
    d
}

#[test]
fn configs_that_do_not_describe_the_weights_fail_cleanly() {
    use serde_json::json;
    for (key, value, needle) in [
        // Fewer layers than the checkpoint holds: strict like mlx-lm, not a silent other model.
        (
            "num_hidden_layers",
            json!(1),
            "tensors that the llama model its config describes (num_hidden_layers 1) does not use: model.layers.1.",
        ),
        ("num_hidden_layers", json!(0), "num_hidden_layers is 0"),
        ("rms_norm_eps", json!(-1.0), "rms_norm_eps -1 is not a positive number"),
        (
            "hidden_act",
            json!("relu6_weird"),
            "hidden_act \"relu6_weird\" is not supported",
        ),
        (
            "eos_token_id",
            json!(99999),
            "eos_token_id 99999 is outside the vocabulary 0..512",
        ),
        ("max_position_embeddings", json!(0), "max_position_embeddings is 0"),
    ] {
        let d = with_config(key, value);
        fails_with(
            &[
                "-m",
                d.to_str().unwrap(),
                "generate",
                "--prompt-tokens",
                "1,2",
                "-n",
                "2",
            ],
            needle,
        );
        std::fs::remove_dir_all(&d).ok();
    }
    // Every weight NaN (bf16 0xffff): perplexity says so rather than printing NaN.
    let d = scratch_copy("llama-bf16", "nan");
    let st = d.join("model.safetensors");
    let mut bytes = std::fs::read(&st).unwrap();
    let header = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    bytes[header..].fill(0xff);
    std::fs::write(&st, bytes).unwrap();
    fails_with(
        &["-m", d.to_str().unwrap(), "perplexity", "--tokens", "1,2,3"],
        "the model's logits are not finite",
    );
    fails_with(
        &[
            "-m",
            d.to_str().unwrap(),
            "generate",
            "--prompt-tokens",
            "1,2,3",
            "-n",
            "2",
        ],
        "the model's logits after the prompt are not finite",
    );
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn broken_checkpoints_fail_cleanly() {
    // Unknown model_type.
    let d = scratch_copy("qwen3-q4g64", "type");
    let cfg = std::fs::read_to_string(d.join("config.json"))
        .unwrap()
        .replace("\"qwen3\"", "\"qwen9\"");
    std::fs::write(d.join("config.json"), cfg).unwrap();
    fails_with(
        &["-m", d.to_str().unwrap(), "perplexity", "--tokens", "1,2"],
        "unknown model_type \"qwen9\"; supported: llama, qwen2, qwen3",
    );
    // Missing config.json; malformed config.json.
    std::fs::remove_file(d.join("config.json")).unwrap();
    fails_with(
        &["-m", d.to_str().unwrap(), "perplexity", "--tokens", "1,2"],
        "config.json",
    );
    std::fs::write(d.join("config.json"), "{ nope").unwrap();
    fails_with(
        &["-m", d.to_str().unwrap(), "perplexity", "--tokens", "1,2"],
        "not valid JSON",
    );
    std::fs::remove_dir_all(&d).ok();

    // Bad quantization block.
    let d = scratch_copy("qwen3-q4g64", "quant");
    let cfg = std::fs::read_to_string(d.join("config.json"))
        .unwrap()
        .replace("\"bits\": 4", "\"bits\": 3");
    std::fs::write(d.join("config.json"), cfg).unwrap();
    fails_with(&["-m", d.to_str().unwrap(), "perplexity", "--tokens", "1,2"], "3-bit");
    std::fs::remove_dir_all(&d).ok();

    // Truncated safetensors: the header claims more data than the file holds.
    let d = scratch_copy("llama-bf16", "trunc");
    let st = d.join("model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    std::fs::write(&st, &bytes[..bytes.len() - 1000]).unwrap();
    fails_with(
        &["-m", d.to_str().unwrap(), "perplexity", "--tokens", "1,2"],
        "model.safetensors",
    );
    // Garbage instead of a header.
    std::fs::write(&st, b"\xff\xff\xff\xff\xff\xff\xff\x7fgarbage").unwrap();
    fails_with(
        &["-m", d.to_str().unwrap(), "perplexity", "--tokens", "1,2"],
        "not a valid safetensors file",
    );
    std::fs::remove_dir_all(&d).ok();
}

/// Writes a safetensors file by hand: 8-byte header length, JSON header, data.
fn write_safetensors(path: &std::path::Path, tensors: &[(&str, &str, Vec<usize>, Vec<u8>)]) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let start = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            name.to_string(),
            serde_json::json!({ "dtype": dtype, "shape": shape, "data_offsets": [start, data.len()] }),
        );
    }
    let h = serde_json::Value::Object(header).to_string().into_bytes();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    std::fs::write(path, out).unwrap();
}

#[test]
fn missing_and_misshapen_tensors_are_named() {
    let d = std::env::temp_dir().join(format!("mlxcel-cli-tensors-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    let config = serde_json::json!({
        "model_type": "llama", "hidden_size": 8, "num_hidden_layers": 1, "intermediate_size": 16,
        "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 10, "tie_word_embeddings": true
    });
    std::fs::write(d.join("config.json"), config.to_string()).unwrap();
    let f32s = |n: usize| vec![0u8; n * 4];
    // Only the embedding, with the wrong width.
    write_safetensors(
        &d.join("model.safetensors"),
        &[("model.embed_tokens.weight", "F32", vec![10, 9], f32s(90))],
    );
    fails_with(
        &["-m", d.to_str().unwrap(), "perplexity", "--tokens", "1,2"],
        "checkpoint has no tensor model.layers.0.self_attn.q_proj.weight",
    );
    write_safetensors(
        &d.join("model.safetensors"),
        &[
            ("model.embed_tokens.weight", "F32", vec![10, 9], f32s(90)),
            ("model.layers.0.self_attn.q_proj.weight", "F32", vec![8, 7], f32s(56)),
        ],
    );
    fails_with(
        &["-m", d.to_str().unwrap(), "perplexity", "--tokens", "1,2"],
        "tensor model.layers.0.self_attn.q_proj.weight: expected shape [8, 8], found [8, 7]",
    );
    // A header whose offsets point past the data.
    write_safetensors(
        &d.join("model.safetensors"),
        &[("model.embed_tokens.weight", "F32", vec![10, 8], f32s(8))],
    );
    fails_with(
        &["-m", d.to_str().unwrap(), "perplexity", "--tokens", "1,2"],
        "model.safetensors",
    );
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn bench_reports_speed_on_a_random_weight_preset() {
    let j = json_out(&mlxcel(&[
        "bench",
        "--preset",
        "smollm2-135m-4bit",
        "--prompt",
        "8",
        "-n",
        "4",
        "--runs",
        "1",
        "--json",
    ]));
    assert_eq!(j["device"], "cpu");
    assert_eq!(j["prompt"], 8);
    assert!(j["decode_tps_median"].as_f64().unwrap() > 0.0, "{j}");
    assert_eq!(j["decode_tps"].as_array().unwrap().len(), 1);
    fails_with(&["bench", "--preset", "gpt-9"], "unknown preset \"gpt-9\"");
    fails_with(&["bench"], "--preset NAME or --model PATH");
    fails_with(&["bench", "--preset", "smollm2-135m-4bit", "-m", "x"], "not both");
}

fn mlxcel_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mlxcel"));
    c.args(args).env_remove("MLXCEL_DTYPE").env_remove("MLXCEL_TRACE_DTYPE");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("mlxcel runs")
}

#[test]
fn the_dtype_policy_comes_from_the_flag_then_the_env_then_mlxcel_toml() {
    let dir = scratch_copy("llama-bf16", "dtype");
    let m = dir.to_str().unwrap();
    let run = |extra: &[&str], env: &[(&str, &str)]| {
        let mut args = vec!["-m", m, "--device", "cpu"];
        args.extend(extra);
        args.extend(["generate", "--prompt-tokens", "1,2,3", "-n", "2", "--json"]);
        let j = json_out(&mlxcel_env(&args, env));
        (
            j["dtype_policy"].as_str().unwrap().to_string(),
            j["activation_dtype"].as_str().unwrap().to_string(),
        )
    };
    let pair = |p: &str, a: &str| (p.to_string(), a.to_string());
    // Default: auto, which on the CPU keeps f32 activations.
    assert_eq!(run(&[], &[]), pair("auto", "f32"));
    std::fs::write(dir.join("mlxcel.toml"), "dtype = \"bf16\"\n").unwrap();
    assert_eq!(run(&[], &[]), pair("bf16", "bf16"), "mlxcel.toml beats the default");
    assert_eq!(
        run(&[], &[("MLXCEL_DTYPE", "f16")]),
        pair("f16", "f16"),
        "the env beats the file"
    );
    assert_eq!(
        run(&["--dtype", "f32"], &[("MLXCEL_DTYPE", "f16")]),
        pair("f32", "f32"),
        "the flag beats the env"
    );
    std::fs::write(dir.join("mlxcel.toml"), "dtype = \"fp8\"\n").unwrap();
    let o = mlxcel_env(&["-m", m, "generate", "hi"], &[]);
    let e = stderr(&o);
    assert!(
        !o.status.success() && e.contains("mlxcel.toml") && e.contains("\"fp8\""),
        "{e}"
    );
    let o = mlxcel_env(&["-m", m, "--dtype", "f16", "generate", "hi"], &[]);
    assert!(!o.status.success(), "a bad file is reported even under --dtype");
    let o = mlxcel_env(
        &["-m", &fixture("llama-bf16"), "generate", "hi"],
        &[("MLXCEL_DTYPE", "half")],
    );
    let e = stderr(&o);
    assert!(
        !o.status.success() && e.contains("MLXCEL_DTYPE") && e.contains("\"half\""),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// `generate --json` of `n` tokens after the prompt ids `tokens`, on the CPU under `policy`.
fn generate_json_on_cpu(model: &str, policy: &str, tokens: &str, n: &str, env: &[(&str, &str)]) -> Output {
    let args = [
        "-m",
        model,
        "--device",
        "cpu",
        "--dtype",
        policy,
        "generate",
        "--prompt-tokens",
        tokens,
        "-n",
        n,
        "--json",
    ];
    mlxcel_env(&args, env)
}

#[test]
fn trace_dtype_counts_astype_per_decode_step_and_f16_leaves_none() {
    // f32 norm weights in a model whose other tensors are bf16: under `native` the norms
    // promote (AsType in every step); under a single-dtype policy they were converted at load.
    let m = fixture("qwen3-q4g128-f32norms");
    let trace = |policy: &str| {
        let o = generate_json_on_cpu(&m, policy, "1,2,3", "3", &[("MLXCEL_TRACE_DTYPE", "1")]);
        let e = stderr(&o);
        let j = json_out(&o);
        let line = e
            .lines()
            .find(|l| l.starts_with("mlxcel: decode graph: "))
            .unwrap_or_else(|| panic!("no summary line in: {e}"))
            .to_string();
        let astype = j["astype_per_step"].as_u64().unwrap();
        let nodes = j["nodes_per_step"].as_u64().unwrap();
        assert_eq!(
            line,
            format!(
                "mlxcel: decode graph: {astype} AsType of {nodes} nodes per step (dtype policy {policy}, backend cpu)"
            )
        );
        (astype, e)
    };
    let (native, e) = trace("native");
    assert!(native > 0, "native keeps the f32 norms' promotions: {e}");
    assert!(e.contains("AsType"), "the breakdown names the casts: {e}");
    for policy in ["f16", "bf16", "f32"] {
        let (n, e) = trace(policy);
        assert_eq!(n, 0, "{policy}: {e}");
    }
    // Untraced, the JSON still carries the counts, and nothing is printed per step.
    let o = generate_json_on_cpu(&m, "native", "1,2", "2", &[]);
    assert!(!stderr(&o).contains("mlxcel: trace:"), "{}", stderr(&o));
    assert_eq!(json_out(&o)["astype_per_step"].as_u64(), Some(native));
}
