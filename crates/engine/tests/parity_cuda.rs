//! The mlx-lm parity checks of parity.rs on the CUDA backend (f32 activations). Skipped with a
//! notice without a GPU, unless MLXCEL_REQUIRE_CUDA=1.

mod common;

use common::{floats, ids, root, trusted_steps};
use mlxcel_core::DType;
use mlxcel_engine::{Engine, GenerateOptions, SamplerSettings};
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
    ] {
        let dir = root().join("tests/fixtures/parity").join(case);
        let r: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
        let backend = Box::new(mlxcel_cuda::CudaBackend::new().unwrap());
        let mut e = Engine::new(mlxcel_models::load(&dir).unwrap(), backend, DType::F32, None).unwrap();
        let want = floats(&r["nll"]);
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
