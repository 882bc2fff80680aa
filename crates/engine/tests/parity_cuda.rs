//! The mlx-lm parity checks of parity.rs on the CUDA backend (f32 activations). Skipped with a
//! notice without a GPU, unless MLXCEL_REQUIRE_CUDA=1.

mod common;

use common::{dtype_tolerance, floats, ids, root, trusted_steps};
use mlxcel_core::DType;
use mlxcel_engine::{Engine, GenerateOptions, SamplerSettings};
use mlxcel_models::DTypePolicy;
use serde_json::Value;

#[test]
fn cuda_matches_mlx_lm_on_the_parity_fixtures() {
    let cuda = match mlxcel_cuda::CudaBackend::new() {
        Ok(b) => b,
        Err(e) if std::env::var("MLXCEL_REQUIRE_CUDA").as_deref() != Ok("1") => {
            return eprintln!("skipping CUDA parity: {e}");
        }
        Err(e) => panic!("{e}"),
    };
    let _ = cuda;
    for (case, tol) in [
        ("llama-bf16", 0.02),
        ("llama-rope3-q4g64", 0.05),
        ("qwen2-bias-tied-bf16", 0.02),
        ("qwen2-bias-tied-q8g32", 0.05),
        ("qwen3-q4g64", 0.05),
        ("qwen3-q4g128-f32norms", 0.05),
        ("qwen3_moe-q4g64", 0.05),
        ("gemma2-softcap-bf16", 0.02),
        ("gemma3-text-bf16", 0.02),
        ("gemma3-text-q4g64", 0.05),
    ] {
        let dir = root().join("tests/fixtures/parity").join(case);
        let r: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
        let want = floats(&r["nll"]);
        // `auto` is single-dtype f16 on CUDA (bf16 for f16-fragile models); the tolerance is
        // the activation dtype's, as in parity.rs.
        for policy in [DTypePolicy::Auto, DTypePolicy::BF16] {
            let backend = Box::new(mlxcel_cuda::CudaBackend::new().unwrap());
            let (model, plan) = mlxcel_models::load_for(&dir, policy, "cuda", &mut |_, _| {}).unwrap();
            let limit = dtype_tolerance(plan.activation_dtype(&model), tol);
            let mut e = Engine::for_plan(model, backend, &plan, None).unwrap();
            let got = e.perplexity(&ids(&r["prompt_tokens"]), 512).unwrap();
            let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            eprintln!("{case}: CUDA under {policy}: max |dnll| {worst:.2e} (limit {limit})");
            assert!(
                worst <= limit,
                "{case}: max |nll - mlx-lm| on CUDA under {policy} = {worst}"
            );
        }
        let backend = Box::new(mlxcel_cuda::CudaBackend::new().unwrap());
        let mut e = Engine::new(mlxcel_models::load(&dir).unwrap(), backend, DType::F32, None).unwrap();
        let got = e.perplexity(&ids(&r["prompt_tokens"]), 512).unwrap();
        let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(worst <= tol, "{case}: max |nll - mlx-lm| on CUDA = {worst}");
        let greedy = ids(&r["greedy_tokens"]);
        let margins = floats(&r["greedy_margins"]);
        let trusted = trusted_steps(&margins, 0.05).min(greedy.len());
        let opts = GenerateOptions {
            max_tokens: trusted,
            sampler: SamplerSettings::default(),
            prefill_chunk: 512,
        };
        let g = e
            .generate(&ids(&r["prompt_tokens"]), &opts, &|_| false, |_| Ok(true))
            .unwrap();
        assert_eq!(g.tokens, greedy[..trusted], "{case}: greedy tokens on CUDA");
        eprintln!("{case}: CUDA max |dnll| {worst:.2e}, {trusted} greedy tokens equal");
    }
}

#[test]
fn auto_on_cuda_leaves_no_astype_in_the_decode_step() {
    if let Err(e) = mlxcel_cuda::CudaBackend::new() {
        if std::env::var("MLXCEL_REQUIRE_CUDA").as_deref() == Ok("1") {
            panic!("{e}");
        }
        return eprintln!("skipping the CUDA AsType check: {e}");
    }
    // bf16 weights, f32 norm weights: `native` promotes at every norm, `auto` converted them.
    let dir = root().join("tests/fixtures/parity/qwen3-q4g128-f32norms");
    let mut counts = Vec::new();
    for policy in [DTypePolicy::Native, DTypePolicy::Auto] {
        let (model, plan) = mlxcel_models::load_for(&dir, policy, "cuda", &mut |_, _| {}).unwrap();
        let backend = Box::new(mlxcel_cuda::CudaBackend::new().unwrap());
        let mut e = Engine::for_plan(model, backend, &plan, Some(64)).unwrap();
        let opts = GenerateOptions {
            max_tokens: 3,
            sampler: SamplerSettings::default(),
            prefill_chunk: 512,
        };
        e.generate(&[1, 2, 3], &opts, &|_| false, |_| Ok(true)).unwrap();
        let (astype, nodes) = e.decode_counts().expect("a decode step ran");
        eprintln!("CUDA under {policy}: {astype} AsType of {nodes} nodes per decode step");
        counts.push(astype);
    }
    assert!(counts[0] > 0, "native keeps the promotions of the f32 norms");
    assert_eq!(counts[1], 0, "auto on CUDA: one dtype end to end");
}
