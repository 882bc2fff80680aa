//! Sessions: planned graphs run many times, share KV-cache states by name, validate their
//! inputs, and report runtime faults as errors.

use mlxcel_core::rng::SplitMix64;
use mlxcel_core::{Backend, CompileOptions, DType, Graph, GraphBuilder, HostTensor, Session};
use mlxcel_cpu::CpuBackend;

const D: usize = 16;
const HEADS: usize = 2;
const HD: usize = D / HEADS;
const CAP: usize = 8;

fn weight(rng: &mut SplitMix64, rows: usize, cols: usize) -> HostTensor {
    HostTensor::from_f32(DType::F32, &[rows, cols], &rng.signed_vec(rows * cols, 0.5)).unwrap()
}

/// One causal self-attention block over `t` tokens written into a cache at `offset`.
fn attention_step(t: usize) -> Graph {
    let mut rng = SplitMix64(11);
    let mut b = GraphBuilder::default();
    let x = b.input("x", DType::F32, &[1, t, D]);
    let positions = b.input("positions", DType::I32, &[t]);
    let offset = b.input("offset", DType::I32, &[]);
    let kv_len = b.add_scalar(offset, t as f32).unwrap();
    let freqs: Vec<f32> = (0..HD / 2)
        .map(|i| 1.0 / 100f32.powf(i as f32 / (HD / 2) as f32))
        .collect();
    let inv_freq = b.constant(HostTensor::from_f32(DType::F32, &[HD / 2], &freqs).unwrap());
    let mut proj = |b: &mut GraphBuilder, name: &str| {
        let w = b.parameter(name, weight(&mut rng, D, D));
        let y = b.matmul_t(x, w).unwrap();
        let y = b.reshape(y, &[1, t, HEADS, HD]).unwrap();
        b.swap_axes(y, 1, 2).unwrap()
    };
    let (q, k, v) = (proj(&mut b, "q"), proj(&mut b, "k"), proj(&mut b, "v"));
    let q = b.rope(q, positions, inv_freq, HD, false, 1.0).unwrap();
    let k = b.rope(k, positions, inv_freq, HD, false, 1.0).unwrap();
    let kc = b.state("k_cache", DType::F32, &[1, HEADS, CAP, HD]);
    let vc = b.state("v_cache", DType::F32, &[1, HEADS, CAP, HD]);
    let kc = b.kv_write(kc, k, offset).unwrap();
    let vc = b.kv_write(vc, v, offset).unwrap();
    let a = b
        .attention(q, kc, vc, kv_len, 1.0 / (HD as f32).sqrt(), true, None, None)
        .unwrap();
    let a = b.name(a, "attn");
    let a = b.swap_axes(a, 1, 2).unwrap();
    let a = b.reshape(a, &[1, t, D]).unwrap();
    b.finish(&[a])
}

fn inputs(x: &[f32], t: usize, offset: usize) -> Vec<HostTensor> {
    let pos: Vec<i32> = (offset..offset + t).map(|p| p as i32).collect();
    vec![
        HostTensor::from_f32(DType::F32, &[1, t, D], x).unwrap(),
        HostTensor::from_slice(&[t], &pos).unwrap(),
        HostTensor::from_slice(&[], &[offset as i32]).unwrap(),
    ]
}

fn session() -> Box<dyn Session> {
    CpuBackend.new_session().unwrap()
}

#[test]
fn cached_decode_equals_the_full_forward() {
    let x = SplitMix64(3).signed_vec(5 * D, 1.0);
    // Full forward over 5 tokens.
    let mut full = session();
    let id = full.load(&attention_step(5), CompileOptions::default()).unwrap();
    let want = full.run(id, &inputs(&x, 5, 0)).unwrap()[0].to_f32_vec();
    // 4-token prefill, then one decode step, sharing the cache.
    let mut cached = session();
    let pre = cached.load(&attention_step(4), CompileOptions::default()).unwrap();
    let dec = cached.load(&attention_step(1), CompileOptions::default()).unwrap();
    let got_pre = cached.run(pre, &inputs(&x[..4 * D], 4, 0)).unwrap()[0].to_f32_vec();
    let got = cached.run(dec, &inputs(&x[4 * D..], 1, 4)).unwrap()[0].to_f32_vec();
    for (i, (g, w)) in got_pre.iter().chain(&got).zip(&want).enumerate() {
        assert!((g - w).abs() < 1e-5, "element {i}: cached {g} vs full {w}");
    }
}

#[test]
fn repeated_runs_reuse_buffers_without_stale_values() {
    let mut s = session();
    let id = s.load(&attention_step(1), CompileOptions::default()).unwrap();
    let x = SplitMix64(9).signed_vec(D, 1.0);
    let first = s.run(id, &inputs(&x, 1, 0)).unwrap()[0].to_f32_vec();
    // Same token at the same position again: the cache slot is overwritten with the same row.
    let again = s.run(id, &inputs(&x, 1, 0)).unwrap()[0].to_f32_vec();
    assert_eq!(first, again);
    let planned = s.memory().planned_bytes;
    let all_values: usize = attention_step(1)
        .nodes
        .iter()
        .map(|n| n.shape.iter().product::<usize>() * n.dtype.size())
        .sum();
    assert!(
        planned < all_values,
        "planner shares buffers: {planned} of {all_values} bytes"
    );
}

#[test]
fn named_values_are_kept_only_when_asked() {
    let x = SplitMix64(1).signed_vec(D, 1.0);
    let mut s = session();
    let id = s.load(&attention_step(1), CompileOptions { keep_named: true }).unwrap();
    let out = s.run(id, &inputs(&x, 1, 0)).unwrap()[0].to_f32_vec();
    let named = s.named_values(id).unwrap();
    assert_eq!(named.len(), 1);
    assert_eq!(named[0].0.to_string(), "attn");
    let mut attn = named[0].1.to_f32_vec();
    attn.sort_by(f32::total_cmp);
    let mut sorted = out.clone();
    sorted.sort_by(f32::total_cmp);
    assert_eq!(
        attn, sorted,
        "[1, H, 1, hd] holds the same values as the [1, 1, D] output"
    );
    let mut plain = session();
    let id = plain.load(&attention_step(1), CompileOptions::default()).unwrap();
    assert!(plain.named_values(id).is_err());
}

#[test]
fn wrong_inputs_are_clear_errors() {
    let mut s = session();
    let id = s.load(&attention_step(1), CompileOptions::default()).unwrap();
    let x = vec![0.0; D];
    let e = s.run(id, &inputs(&x, 1, 0)[..2]).unwrap_err().to_string();
    assert!(e.contains("3 inputs") && e.contains("positions"), "{e}");
    let mut bad = inputs(&x, 1, 0);
    bad[1] = HostTensor::from_slice(&[1], &[0u32]).unwrap();
    let e = s.run(id, &bad).unwrap_err().to_string();
    assert!(e.contains("input positions") && e.contains("i32"), "{e}");
}

#[test]
fn writing_past_the_cache_is_an_error_not_a_crash() {
    let mut s = session();
    let id = s.load(&attention_step(1), CompileOptions::default()).unwrap();
    let e = s.run(id, &inputs(&[0.0; D], 1, CAP)).unwrap_err().to_string();
    assert!(e.contains("kv_write") && e.contains("overflow"), "{e}");
}

#[test]
fn states_shared_by_name_must_agree() {
    let mut s = session();
    s.load(&attention_step(1), CompileOptions::default()).unwrap();
    let mut b = GraphBuilder::default();
    let k = b.state("k_cache", DType::F16, &[1, HEADS, CAP, HD]);
    let g = b.finish(&[k]);
    let e = s.load(&g, CompileOptions::default()).unwrap_err().to_string();
    assert!(e.contains("k_cache") && e.contains("f16"), "{e}");
    let zero = HostTensor::zeros(DType::F32, &[1, HEADS, CAP, HD]);
    s.write_state("k_cache", &zero).unwrap();
    assert!(s.write_state("nope", &zero).is_err());
    assert!(s.write_state("k_cache", &HostTensor::zeros(DType::F32, &[1])).is_err());
}

#[test]
fn out_of_range_token_ids_are_runtime_errors() {
    let mut b = GraphBuilder::default();
    let table = b.parameter("embed", HostTensor::zeros(DType::BF16, &[10, 4]));
    let ids = b.input("ids", DType::I32, &[2]);
    let y = b.gather(table, ids).unwrap();
    let g = b.finish(&[y]);
    let mut s = session();
    let id = s.load(&g, CompileOptions::default()).unwrap();
    let e = s
        .run(id, &[HostTensor::from_slice(&[2], &[3i32, 10]).unwrap()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("gather") && e.contains("10"), "{e}");
    let ok = s.run(id, &[HostTensor::from_slice(&[2], &[3i32, 9]).unwrap()]).unwrap();
    assert_eq!(ok[0].shape, [2, 4]);
}

#[test]
fn an_unloaded_graph_frees_its_buffers_and_others_still_run() {
    let x = SplitMix64(5).signed_vec(4 * D, 1.0);
    let mut s = session();
    let pre = s.load(&attention_step(4), CompileOptions::default()).unwrap();
    let dec = s.load(&attention_step(1), CompileOptions::default()).unwrap();
    let before = s.memory();
    s.run(pre, &inputs(&x, 4, 0)).unwrap();
    let want = s.run(dec, &inputs(&x[..D], 1, 4)).unwrap()[0].to_f32_vec();
    s.unload(pre).unwrap();
    let after = s.memory();
    assert!(after.planned_bytes < before.planned_bytes, "{after:?} vs {before:?}");
    assert_eq!(after.state_bytes, before.state_bytes, "the shared cache stays");
    let err = s.run(pre, &inputs(&x, 4, 0)).unwrap_err().to_string();
    assert!(err.contains("no graph"), "{err}");
    assert!(s.unload(pre).is_err(), "unloading twice");
    // The decode graph still runs on the cache the unloaded one filled.
    let again = s.run(dec, &inputs(&x[..D], 1, 4)).unwrap()[0].to_f32_vec();
    assert_eq!(again, want);
    // A new graph gets a new id.
    let third = s.load(&attention_step(2), CompileOptions::default()).unwrap();
    assert!(third != pre && third != dec);
}
