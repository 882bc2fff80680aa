//! Parity with mlx-lm on the committed fixtures (tests/fixtures/parity, written by
//! scripts/make_parity_fixtures.py with mlx 0.32.4 / mlx-lm 0.32.2, activations in f32):
//! per-token NLL, greedy tokens up to the first near-tie, cached decode against the full
//! forward, and prefill chunking.

mod common;

use std::path::PathBuf;

use common::{dtype_tolerance, floats, ids, root, trusted_steps};
use mlxcel_core::DType;
use mlxcel_engine::{Engine, GenerateOptions, SamplerSettings};
use mlxcel_models::DTypePolicy;
use serde_json::Value;

const CASES: &[(&str, f64)] = &[
    ("llama-bf16", 0.02),
    ("llama-rope3-q4g64", 0.05),
    ("qwen2-bias-tied-bf16", 0.02),
    ("qwen2-bias-tied-q8g32", 0.05),
    ("qwen3-q4g64", 0.05),
    ("qwen3-q4g128-f32norms", 0.05),
    ("qwen3_moe-q4g64", 0.05),
    ("qwen2_moe-q4g64", 0.05),
    ("gemma2-softcap-bf16", 0.02),
    ("gemma3-text-bf16", 0.02),
    ("gemma3-text-q4g64", 0.05),
];

/// Greedy steps whose reference top1−top2 margin is below this may legitimately differ.
const NEAR_TIE: f64 = 0.05;

fn fixture(case: &str) -> (PathBuf, Value) {
    let dir = root().join("tests/fixtures/parity").join(case);
    let text = std::fs::read_to_string(dir.join("reference.json")).expect("reference.json");
    let reference: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        reference["format"], "mlxcel-parity-v1",
        "{case}: unknown reference format"
    );
    (dir, reference)
}

fn engine(dir: &std::path::Path) -> Engine {
    let model = mlxcel_models::load(dir).unwrap_or_else(|e| panic!("{}: {e:#}", dir.display()));
    Engine::new(model, Box::new(mlxcel_cpu::CpuBackend), DType::F32, None).unwrap()
}

/// Greedy tokens must agree up to (not including) the first near-tie step of the reference.
fn check_greedy(case: &str, got: &[u32], want: &[u32], margins: &[f64]) {
    let trusted = trusted_steps(margins, NEAR_TIE).min(want.len());
    assert!(
        trusted > 0 || want.is_empty(),
        "{case}: the first reference step is already a near-tie"
    );
    assert_eq!(
        &got[..trusted],
        &want[..trusted],
        "{case}: greedy tokens differ before any near-tie"
    );
}

#[test]
fn nll_matches_mlx_lm() {
    for &(case, tol) in CASES {
        let (dir, r) = fixture(case);
        let want = floats(&r["nll"]);
        let got = engine(&dir).perplexity(&ids(&r["prompt_tokens"]), 512).unwrap();
        assert_eq!(got.len(), want.len(), "{case}");
        let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        eprintln!("{case}: max |nll - mlx-lm| = {worst:.2e}");
        assert!(worst <= tol, "{case}: max |nll - mlx-lm| = {worst} > {tol}");
    }
}

#[test]
fn nll_matches_mlx_lm_under_each_dtype_policy() {
    let mut failures = Vec::new();
    for &(case, tol) in CASES {
        let (dir, r) = fixture(case);
        let want = floats(&r["nll"]);
        for policy in [
            DTypePolicy::Native,
            DTypePolicy::F32,
            DTypePolicy::F16,
            DTypePolicy::BF16,
        ] {
            let (model, plan) = mlxcel_models::load_for(&dir, policy, "cpu", &mut |_, _| {}).unwrap();
            let activations = plan.activation_dtype(&model);
            let mut e = Engine::for_plan(model, Box::new(mlxcel_cpu::CpuBackend), &plan, None).unwrap();
            let got = e.perplexity(&ids(&r["prompt_tokens"]), 512).unwrap();
            let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            let limit = dtype_tolerance(activations, tol);
            eprintln!("{case} under {policy} ({activations}): max |nll - mlx-lm| = {worst:.2e} (limit {limit})");
            if worst > limit {
                failures.push(format!("{case} under {policy}: {worst} > {limit}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn greedy_decode_matches_mlx_lm() {
    for &(case, _) in CASES {
        let (dir, r) = fixture(case);
        let want = ids(&r["greedy_tokens"]);
        let opts = GenerateOptions {
            max_tokens: want.len(),
            sampler: SamplerSettings::default(),
            prefill_chunk: 512,
        };
        let g = engine(&dir)
            .generate(&ids(&r["prompt_tokens"]), &opts, &|_| false, |_| Ok(true))
            .unwrap();
        check_greedy(case, &g.tokens, &want, &floats(&r["greedy_margins"]));
    }
}

/// A multimodal `gemma3` checkpoint (as mlx-vlm writes it: the text model's tensors under
/// `language_model.`, a vision tower and projector beside them, the text model's config under
/// `text_config`) runs its text part: the gemma3 text fixture rewritten that way gives
/// mlx-lm's NLL.
#[test]
fn a_multimodal_gemma3_checkpoint_runs_its_text_part() {
    use mlxcel_models::checkpoint::Checkpoint;
    let (dir, r) = fixture("gemma3-text-bf16");
    let text = Checkpoint::open_dir(&dir).unwrap();
    let mut tensors: Vec<_> = text
        .names()
        .map(|n| (format!("language_model.{n}"), text.get(n).unwrap()))
        .collect();
    // Vision weights the text model must leave alone.
    for name in [
        "vision_tower.vision_model.embeddings.patch_embedding.weight",
        "multi_modal_projector.mm_input_projection_weight",
    ] {
        let t = text.get("model.embed_tokens.weight").unwrap();
        tensors.push((name.to_string(), t));
    }
    let mut text_config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let vocab = text_config["vocab_size"].clone();
    text_config.as_object_mut().unwrap().remove("architectures");
    let config = serde_json::json!({
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "vocab_size": vocab, "text_config": text_config,
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 128},
    });
    let out = std::env::temp_dir().join(format!("mlxcel-gemma3-mm-{}", std::process::id()));
    mlxcel_models::writer::save_folder(&out, config, &tensors, &Default::default()).unwrap();
    let got = engine(&out).perplexity(&ids(&r["prompt_tokens"]), 512);
    std::fs::remove_dir_all(&out).ok();
    let (got, want) = (got.unwrap(), floats(&r["nll"]));
    assert_eq!(got.len(), want.len());
    let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    assert!(worst <= 0.02, "multimodal gemma3: max |nll - mlx-lm| = {worst}");
}

#[test]
fn cached_decode_and_prefill_chunks_equal_the_full_forward() {
    for &(case, _) in CASES {
        let (dir, r) = fixture(case);
        let mut tokens = ids(&r["prompt_tokens"]);
        tokens.extend(ids(&r["greedy_tokens"]));
        let mut e = engine(&dir);
        let full = e.perplexity(&tokens, 512).unwrap();
        // Chunk 1 is pure cached decode; the others split the prefill unevenly.
        for chunk in [1, 5, 16] {
            let got = e.perplexity(&tokens, chunk).unwrap();
            let worst = got.iter().zip(&full).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(
                worst < 1e-4,
                "{case}: chunk {chunk} differs from the full forward by {worst}"
            );
        }
    }
}

#[test]
fn chat_prompt_and_greedy_reply_match_mlx_lm_with_the_fixture_tokenizer() {
    let dir = root().join("tests/fixtures/parity/llama-bf16");
    let text = std::fs::read_to_string(dir.join("tokenizer_reference.json")).unwrap();
    let r: Value = serde_json::from_str(&text).unwrap();
    let tok = mlxcel_engine::tokenizer::Tokenizer::from_dir(&dir).unwrap();
    for sample in r["encode"].as_array().unwrap() {
        assert_eq!(
            tok.encode(sample["text"].as_str().unwrap()).unwrap(),
            ids(&sample["ids"]),
            "{sample}"
        );
    }
    let chat = &r["chat"];
    let messages: Vec<mlxcel_engine::chat::ChatMessage> = serde_json::from_value(chat["messages"].clone()).unwrap();
    let prompt = tok.encode_chat(&messages).unwrap();
    assert_eq!(prompt, ids(&chat["ids"]));
    let want = ids(&chat["greedy_tokens"]);
    let opts = GenerateOptions {
        max_tokens: want.len(),
        sampler: SamplerSettings::default(),
        prefill_chunk: 512,
    };
    let g = engine(&dir).generate(&prompt, &opts, &|_| false, |_| Ok(true)).unwrap();
    check_greedy("llama-bf16 chat", &g.tokens, &want, &floats(&chat["greedy_margins"]));
}

#[test]
fn seeded_sampling_is_reproducible_and_seed_dependent() {
    let (dir, r) = fixture("llama-bf16");
    let prompt = ids(&r["prompt_tokens"]);
    let run = |seed: u64| {
        let sampler = SamplerSettings {
            temperature: 1.0,
            top_p: 0.9,
            top_k: 50,
            min_p: 0.02,
            seed,
            ..Default::default()
        };
        let opts = GenerateOptions {
            max_tokens: 12,
            sampler,
            prefill_chunk: 512,
        };
        engine(&dir)
            .generate(&prompt, &opts, &|_| false, |_| Ok(true))
            .unwrap()
            .tokens
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8), "different seeds should give different samples");
}

#[test]
fn repetition_penalty_changes_a_repetitive_greedy_run() {
    // qwen3-q4g64's greedy reply starts by repeating one token three times.
    let (dir, r) = fixture("qwen3-q4g64");
    let prompt = ids(&r["prompt_tokens"]);
    let greedy = ids(&r["greedy_tokens"]);
    assert_eq!(greedy[0], greedy[1], "fixture changed: the test relies on a repeat");
    let sampler = SamplerSettings {
        repetition_penalty: 5.0,
        ..Default::default()
    };
    let opts = GenerateOptions {
        max_tokens: 4,
        sampler,
        prefill_chunk: 512,
    };
    let g = engine(&dir).generate(&prompt, &opts, &|_| false, |_| Ok(true)).unwrap();
    assert_eq!(g.tokens[0], greedy[0], "the first token was not seen before");
    assert_ne!(
        g.tokens[1], g.tokens[0],
        "a strong penalty must stop the immediate repeat"
    );
}
