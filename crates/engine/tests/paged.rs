//! Batched generation over the paged KV cache: the same tokens as mlx-lm and as the dense
//! engine, and each sequence's tokens (and logits, bit for bit) independent of its batch.

mod common;

use std::collections::HashMap;

use common::{ids, root, trusted_steps};
use mlxcel_core::DType;
use mlxcel_engine::batcher::{Batcher, Event, SeqParams};
use mlxcel_engine::blocks::BlockPool;
use mlxcel_engine::paged::{PagedEngine, Row};
use mlxcel_engine::scheduler::Scheduler;
use mlxcel_engine::{Engine, FinishReason, GenerateOptions, SamplerSettings};
use serde_json::Value;

fn fixture() -> (std::path::PathBuf, Value) {
    let dir = root().join("tests/fixtures/parity/llama-bf16");
    let r = serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    (dir, r)
}

fn batcher(blocks: usize, block_size: usize, max_batch: usize, chunk: usize) -> Batcher {
    batcher_prefilling(blocks, block_size, max_batch, chunk, chunk)
}

/// A batcher whose steps may prefill `prefill_tokens` positions (chunks of several sequences).
fn batcher_prefilling(
    blocks: usize,
    block_size: usize,
    max_batch: usize,
    chunk: usize,
    prefill_tokens: usize,
) -> Batcher {
    let max_graphs = mlxcel_engine::paged::DEFAULT_MAX_GRAPHS;
    batcher_with(blocks, block_size, max_batch, chunk, prefill_tokens, max_graphs)
}

/// The same, keeping at most `max_graphs` step graphs loaded.
fn batcher_with(
    blocks: usize,
    block_size: usize,
    max_batch: usize,
    chunk: usize,
    prefill_tokens: usize,
    max_graphs: usize,
) -> Batcher {
    let (dir, _) = fixture();
    let model = mlxcel_models::load(&dir).unwrap();
    let engine = PagedEngine::new(model, &mlxcel_cpu::CpuBackend, DType::F32, blocks, block_size, 256)
        .unwrap()
        .with_max_graphs(max_graphs);
    let sched =
        Scheduler::new(BlockPool::new(blocks, block_size), max_batch, chunk).with_prefill_tokens(prefill_tokens);
    Batcher::new(sched, engine)
}

fn greedy(n: usize) -> SeqParams {
    SeqParams {
        max_tokens: n,
        sampler: SamplerSettings::default(),
        eos: vec![],
        logprobs: None,
    }
}

/// Runs every prompt to the end; tokens per id.
fn run_all(b: &mut Batcher, prompts: &[(u64, Vec<u32>, SeqParams)]) -> HashMap<u64, Vec<u32>> {
    for (id, p, params) in prompts {
        b.add(*id, p.clone(), params.clone());
    }
    let mut out: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut finished = 0;
    for _ in 0..10_000 {
        if b.is_idle() {
            break;
        }
        b.step(&mut |id, ev| match ev {
            Event::Token(t, _) => out.entry(id).or_default().push(t),
            Event::Finished(_) => finished += 1,
            Event::Failed(e) => panic!("sequence {id} failed: {e}"),
        })
        .unwrap();
    }
    assert_eq!(finished, prompts.len());
    out
}

#[test]
fn paged_greedy_matches_mlx_lm_and_the_dense_engine() {
    let (dir, r) = fixture();
    let prompt = ids(&r["prompt_tokens"]);
    let want = ids(&r["greedy_tokens"]);
    let margins: Vec<f64> = r["greedy_margins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_f64().unwrap())
        .collect();
    let n = 40;
    // Block 16, chunk 16: the 24-token prompt prefills in two chunks.
    let mut b = batcher(32, 16, 4, 16);
    let got = run_all(&mut b, &[(7, prompt.clone(), greedy(n))]).remove(&7).unwrap();
    let trusted = trusted_steps(&margins, 0.05).min(want.len());
    assert!(trusted > 0);
    assert_eq!(&got[..trusted], &want[..trusted], "paged greedy vs mlx-lm");

    let model = mlxcel_models::load(&dir).unwrap();
    let mut dense = Engine::new(model, Box::new(mlxcel_cpu::CpuBackend), DType::F32, None).unwrap();
    let opts = GenerateOptions {
        max_tokens: n,
        sampler: SamplerSettings::default(),
        prefill_chunk: 16,
    };
    let d = dense.generate(&prompt, &opts, &|_| false, |_| Ok(true)).unwrap();
    assert_eq!(got, d.tokens, "paged vs dense engine, same prefill chunking");
    assert_eq!(b.sched.pool.free_blocks(), 32);
}

#[test]
fn a_sequence_decodes_the_same_alone_and_in_any_batch() {
    let prompts: Vec<Vec<u32>> = (0..7u32)
        .map(|i| (0..(3 + 5 * i)).map(|j| (i * 37 + j * 11) % 500).collect())
        .collect();
    let reqs: Vec<(u64, Vec<u32>, SeqParams)> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| (i as u64, p.clone(), greedy(12 + i)))
        .collect();
    let mut alone = HashMap::new();
    for r in &reqs {
        let mut b = batcher(64, 8, 1, 16);
        alone.extend(run_all(&mut b, std::slice::from_ref(r)));
    }
    // All at once: batches of 1..7 rows padded to 8, prefills interleaved with decodes.
    let mut b = batcher(64, 8, 8, 16);
    let together = run_all(&mut b, &reqs);
    assert_eq!(together, alone);
    assert_eq!(b.sched.pool.free_blocks(), 64);
}

#[test]
fn prefill_chunks_of_several_sequences_in_one_step_give_each_its_own_tokens() {
    // Six prompts: four of 20 positions (chunks 8, 8, 4, prefilled four at a time) and two of
    // 12 (8, 4: their remainders join the others' of 4).
    let reqs: Vec<(u64, Vec<u32>, SeqParams)> = (0..6u32)
        .map(|i| {
            let len = if i < 4 { 20 } else { 12 };
            let p = (0..len).map(|j| (i * 41 + j * 13) % 500).collect();
            (u64::from(i), p, greedy(10 + i as usize))
        })
        .collect();
    let mut alone = HashMap::new();
    for r in &reqs {
        let mut b = batcher(64, 4, 1, 8);
        alone.extend(run_all(&mut b, std::slice::from_ref(r)));
    }
    let mut b = batcher_prefilling(64, 4, 8, 8, 32);
    let together = run_all(&mut b, &reqs);
    assert_eq!(together, alone);
    assert_eq!(b.sched.pool.free_blocks(), 64);
    // The same requests one prefill chunk a step take more steps.
    let mut one = batcher(64, 4, 8, 8);
    assert_eq!(run_all(&mut one, &reqs), alone);
    assert!(b.steps < one.steps, "{} steps against {}", b.steps, one.steps);
    assert!(b.engine().graphs_loaded() > 2, "the shapes need more than two graphs");
    // With two graphs at most, the rest are unloaded and planned again: the same tokens.
    let mut capped = batcher_with(64, 4, 8, 8, 32, 2);
    assert_eq!(run_all(&mut capped, &reqs), alone);
    assert!(capped.engine().graphs_loaded() <= 2);
    assert_eq!(capped.sched.pool.free_blocks(), 64);
}

#[test]
fn logits_of_a_row_are_bit_identical_whatever_else_is_in_the_batch() {
    let (dir, _) = fixture();
    let model = mlxcel_models::load(&dir).unwrap();
    let mut e = PagedEngine::new(model, &mlxcel_cpu::CpuBackend, DType::F32, 64, 4, 256).unwrap();
    // Row A: prompt of 6 at blocks [1, 2]; row B: prompt of 9 at blocks [3, 4, 5].
    let (pa, pb): (Vec<u32>, Vec<u32>) = ((10..16).collect(), (100..109).collect());
    let (ta, tb) = (vec![1u32, 2], vec![3u32, 4, 5]);
    e.step(
        &[Row {
            tokens: &pa[..4],
            start: 0,
            table: &ta,
        }],
        false,
    )
    .unwrap();
    e.step(
        &[Row {
            tokens: &pa[4..5],
            start: 4,
            table: &ta,
        }],
        false,
    )
    .unwrap();
    e.step(
        &[Row {
            tokens: &pb[..8],
            start: 0,
            table: &tb,
        }],
        false,
    )
    .unwrap();
    let a = Row {
        tokens: &pa[5..6],
        start: 5,
        table: &ta,
    };
    let bb = Row {
        tokens: &pb[8..9],
        start: 8,
        table: &tb,
    };
    let alone = e.step(&[a], true).unwrap().logits.unwrap().remove(0);
    // Re-running position 5 rewrites the same keys and values: the cache is unchanged.
    let both = e.step(&[bb, a], true).unwrap().logits.unwrap();
    let again = e.step(&[a], true).unwrap().logits.unwrap().remove(0);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&both[1]), bits(&alone));
    assert_eq!(bits(&again), bits(&alone));
    assert!(alone.iter().all(|x| x.is_finite()));
}

#[test]
fn a_pool_too_small_for_everyone_preempts_and_still_gives_each_its_tokens() {
    let prompts: Vec<(u64, Vec<u32>, SeqParams)> = (0..4u64)
        .map(|i| (i, (0..8).map(|j| (i as u32 * 50 + j) % 500).collect(), greedy(24)))
        .collect();
    // Each needs 32 positions = 8 blocks of 4; 12 blocks hold one and a half.
    let mut b = batcher(12, 4, 4, 8);
    let got = run_all(&mut b, &prompts);
    assert!(b.preemptions > 0, "the pool was meant to run out");
    assert_eq!(b.sched.pool.free_blocks(), 12);
    for (id, p, params) in &prompts {
        let tokens = &got[id];
        assert_eq!(tokens.len(), params.max_tokens);
        // Recompute prefills what was decoded (other kernels, same math up to rounding): on
        // this fixture the greedy tokens still agree exactly.
        let mut alone = batcher(12, 4, 1, 8);
        let want = run_all(&mut alone, &[(*id, p.clone(), params.clone())])
            .remove(id)
            .unwrap();
        assert_eq!(*tokens, want, "sequence {id}");
    }
}

#[test]
fn eos_ends_a_sequence_without_emitting_it() {
    let mut b = batcher(16, 8, 2, 16);
    let prompt: Vec<u32> = (1..9).collect();
    let first = run_all(&mut b, &[(1, prompt.clone(), greedy(5))]).remove(&1).unwrap();
    let mut p = greedy(5);
    assert!(
        !first[..2].contains(&first[2]),
        "pick a prompt whose third token is new: {first:?}"
    );
    p.eos = vec![first[2]];
    let mut events = Vec::new();
    b.add(2, prompt, p);
    while !b.is_idle() {
        b.step(&mut |_, ev| events.push(ev)).unwrap();
    }
    assert_eq!(
        events,
        vec![
            Event::Token(first[0], None),
            Event::Token(first[1], None),
            Event::Finished(FinishReason::Stop)
        ]
    );
    assert_eq!(b.sched.pool.free_blocks(), 16);
}

/// Every event of each sequence, in order.
fn events_of(b: &mut Batcher, reqs: &[(u64, Vec<u32>, SeqParams)]) -> HashMap<u64, Vec<Event>> {
    for (id, p, params) in reqs {
        b.add(*id, p.clone(), params.clone());
    }
    let mut out: HashMap<u64, Vec<Event>> = HashMap::new();
    while !b.is_idle() {
        b.step(&mut |id, ev| out.entry(id).or_default().push(ev)).unwrap();
    }
    out
}

#[test]
fn logprobs_come_with_each_token_and_do_not_depend_on_the_batch() {
    let with_lp = |n| SeqParams {
        logprobs: Some(3),
        ..greedy(n)
    };
    let reqs = vec![
        (1u64, vec![5, 17, 300, 42], with_lp(6)),
        (2, vec![9, 8, 7], greedy(5)),
        (3, vec![11; 9], with_lp(4)),
    ];
    let mut alone = HashMap::new();
    for r in &reqs {
        alone.extend(events_of(&mut batcher(64, 8, 1, 16), std::slice::from_ref(r)));
    }
    let together = events_of(&mut batcher(64, 8, 4, 16), &reqs);
    assert_eq!(together, alone, "logprobs of a row must not depend on the batch");
    for (id, events) in &together {
        let tokens: Vec<&Event> = events.iter().filter(|e| matches!(e, Event::Token(..))).collect();
        assert!(!tokens.is_empty());
        for ev in tokens {
            let Event::Token(t, lp) = ev else { unreachable!() };
            if *id == 2 {
                assert!(lp.is_none(), "sequence 2 did not ask for logprobs");
                continue;
            }
            let lp = lp.as_ref().expect("logprobs asked for");
            assert_eq!(lp.token, *t);
            assert_eq!(lp.top.len(), 3);
            // Greedy: the token is the most likely one, and the list runs downwards.
            assert_eq!(lp.top[0], (*t, lp.logprob));
            assert!(
                lp.top.windows(2).all(|w| w[0].1 >= w[1].1) && lp.logprob <= 0.0,
                "{lp:?}"
            );
        }
    }
}

/// A step that fails (here a token id past the vocabulary, which the embedding gather refuses)
/// ends every sequence it ran with `Failed` and gives back their blocks; sequences outside that
/// step go on, and the pool is whole again once they finish.
#[test]
fn a_failed_step_fails_its_sequences_and_frees_their_blocks() {
    let mut b = batcher(64, 4, 8, 16);
    let total = b.sched.pool.free_blocks();
    b.add(1, vec![1, 2, 3, 4, 5], greedy(6));
    // Sequence 1 prefills alone first, so the bad prompt's prefill is a step of its own.
    let mut events: HashMap<u64, Vec<String>> = HashMap::new();
    let mut record = |id: u64, ev: Event| {
        let e = match ev {
            Event::Token(t, _) => format!("token {t}"),
            Event::Finished(r) => format!("finished {r:?}"),
            Event::Failed(e) => format!("failed {e}"),
        };
        events.entry(id).or_default().push(e);
    };
    b.step(&mut record).unwrap();
    b.add(2, vec![7, 1_000_000, 9], greedy(6));
    for _ in 0..100 {
        if b.is_idle() {
            break;
        }
        b.step(&mut record).unwrap();
    }
    assert!(b.is_idle());
    let bad = &events[&2];
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(bad[0].starts_with("failed"), "{bad:?}");
    let good = &events[&1];
    assert_eq!(good.iter().filter(|e| e.starts_with("token")).count(), 6, "{good:?}");
    assert!(good.last().unwrap().starts_with("finished"), "{good:?}");
    assert_eq!(b.sched.pool.free_blocks(), total, "every block back in the pool");
}
