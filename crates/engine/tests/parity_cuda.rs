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
        ("qwen2_moe-q4g64", 0.05),
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

/// A paged batcher over the CUDA backend (f32 activations) on the llama-bf16 fixture whose
/// steps may prefill `prefill_tokens` positions; greedy tokens of every request, by id.
fn cuda_batched_tokens(
    reqs: &[(u64, Vec<u32>, usize)],
    max_batch: usize,
    prefill_tokens: usize,
) -> std::collections::HashMap<u64, Vec<u32>> {
    use mlxcel_engine::batcher::{Batcher, Event, SeqParams};
    use mlxcel_engine::blocks::BlockPool;
    use mlxcel_engine::paged::PagedEngine;
    use mlxcel_engine::scheduler::Scheduler;
    let dir = root().join("tests/fixtures/parity/llama-bf16");
    let model = mlxcel_models::load(&dir).unwrap();
    let cuda = mlxcel_cuda::CudaBackend::new().unwrap();
    let engine = PagedEngine::new(model, &cuda, DType::F32, 64, 4, 256).unwrap();
    let sched = Scheduler::new(BlockPool::new(64, 4), max_batch, 8).with_prefill_tokens(prefill_tokens);
    let mut b = Batcher::new(sched, engine);
    for (id, p, n) in reqs {
        let params = SeqParams {
            max_tokens: *n,
            sampler: SamplerSettings::default(),
            eos: vec![],
            logprobs: None,
        };
        b.add(*id, p.clone(), params);
    }
    let mut out = std::collections::HashMap::<u64, Vec<u32>>::new();
    for _ in 0..10_000 {
        if b.is_idle() {
            break;
        }
        b.step(&mut |id, ev| match ev {
            Event::Token(t, _) => out.entry(id).or_default().push(t),
            Event::Finished(_) => {}
            Event::Failed(e) => panic!("sequence {id} failed: {e}"),
        })
        .unwrap();
    }
    assert_eq!(b.sched.pool.free_blocks(), 64, "every block back");
    out
}

#[test]
fn prefill_chunks_of_several_requests_in_one_cuda_step_give_each_its_tokens() {
    if let Err(e) = mlxcel_cuda::CudaBackend::new() {
        if std::env::var("MLXCEL_REQUIRE_CUDA").as_deref() != Ok("1") {
            return eprintln!("skipping the CUDA batched prefill check: {e}");
        }
        panic!("{e}");
    }
    // As the CPU test in paged.rs: four prompts of 20 positions, two of 12, chunks of 8 and a
    // budget of 32 (four rows a prefill step). f32 activations: a row's math in a batch differs
    // from its math alone only in summation order, so greedy tokens agree unless a step is a
    // near-tie (none on this fixture at these lengths).
    let reqs: Vec<(u64, Vec<u32>, usize)> = (0..6u32)
        .map(|i| {
            let len = if i < 4 { 20 } else { 12 };
            (
                u64::from(i),
                (0..len).map(|j| (i * 41 + j * 13) % 500).collect(),
                10 + i as usize,
            )
        })
        .collect();
    let mut alone = std::collections::HashMap::new();
    for r in &reqs {
        alone.extend(cuda_batched_tokens(std::slice::from_ref(r), 1, 8));
    }
    assert_eq!(cuda_batched_tokens(&reqs, 8, 32), alone);
}
