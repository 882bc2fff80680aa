//! Routing edge cases of the sparse MoE block against mlx-lm's own blocks on the same weights
//! (tests/fixtures/moe_routing, written by scripts/make_moe_routing_fixture.py): ties in the
//! router probabilities, top-k = number of experts, experts that are never chosen.

mod common;

use common::root;
use mlxcel_core::{Backend, CompileOptions, DType, GraphBuilder, HostTensor};
use mlxcel_models::checkpoint::Checkpoint;
use mlxcel_models::layers::Loader;
use mlxcel_models::moe::{MoeConfig, SparseMoe, TieBreak};
use mlxcel_models::quant::QuantConfig;
use serde_json::Value;

struct Outcome {
    /// Router choice per token, sorted.
    ids: Vec<Vec<i64>>,
    y: Vec<f32>,
    want_ids: Vec<Vec<i64>>,
    want_y: Vec<f32>,
}

fn rows(v: Vec<i64>, k: usize) -> Vec<Vec<i64>> {
    v.chunks(k)
        .map(|r| {
            let mut r = r.to_vec();
            r.sort();
            r
        })
        .collect()
}

fn run_case(name: &str) -> Outcome {
    let dir = root().join("tests/fixtures/moe_routing");
    let cases: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("cases.json")).unwrap()).unwrap();
    assert_eq!(cases["format"], "mlxcel-moe-routing-v1");
    let meta = cases["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["case"] == name)
        .unwrap_or_else(|| panic!("no case {name}"));
    let ck = Checkpoint::open_files(&[dir.join(format!("{name}.safetensors"))]).unwrap();
    let (x, want_y, want_ids) = (ck.get("x").unwrap(), ck.get("y").unwrap(), ck.get("ids").unwrap());
    let quant = match &meta["quantization"] {
        Value::Null => QuantConfig::default(),
        q => QuantConfig::from_config(&serde_json::json!({ "quantization": q })).unwrap(),
    };
    let loader = Loader { checkpoint: ck, quant };
    let cfg: MoeConfig = serde_json::from_value(serde_json::json!({
        "num_experts": meta["experts"],
        "num_experts_per_tok": meta["top_k"],
        "moe_intermediate_size": meta["moe_intermediate_size"],
        "norm_topk_prob": meta["norm_topk_prob"],
        "shared_expert_intermediate_size": meta["shared_expert_intermediate_size"],
    }))
    .unwrap();
    let ties = match meta["arch"].as_str().unwrap() {
        "qwen3_moe" => TieBreak::HighestIndex,
        _ => TieBreak::LowestIndex,
    };
    let spec = cfg.spec(ties).unwrap();
    let d = meta["hidden"].as_u64().unwrap() as usize;
    let moe = SparseMoe::load(&loader, "mlp", d, &spec).unwrap();

    let (t, k) = (x.shape[0], spec.top_k);
    let mut b = GraphBuilder::default();
    let x = HostTensor::from_bytes(DType::F32, vec![1, t, d], x.data.clone()).unwrap();
    let x = b.constant(x);
    let y = moe.forward(&mut b, x).unwrap();
    let (ids, _) = moe.route(&mut b, x).unwrap();
    let graph = b.finish(&[y, ids]);
    let mut session = mlxcel_cpu::CpuBackend.new_session().unwrap();
    let id = session.load(&graph, CompileOptions::default()).unwrap();
    let out = session.run(id, &[]).unwrap();
    Outcome {
        ids: rows(out[1].to_i64_vec().unwrap(), k),
        y: out[0].to_f32_vec(),
        want_ids: rows(want_ids.to_i64_vec().unwrap(), k),
        want_y: want_y.to_f32_vec(),
    }
}

fn check(name: &str) -> Outcome {
    let o = run_case(name);
    assert_eq!(o.ids, o.want_ids, "{name}: experts chosen differ from mlx-lm's");
    assert_eq!(o.y.len(), o.want_y.len());
    let worst =
        o.y.iter()
            .zip(&o.want_y)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
    assert!(worst <= 1e-4, "{name}: max |y - mlx-lm| = {worst}");
    o
}

#[test]
fn equal_router_probabilities_pick_the_highest_experts_like_mlx_argpartition() {
    // Every probability 1/8: qwen3_moe's argpartition(p)[-k:] keeps experts 6 and 7.
    let o = check("all_tied");
    assert!(o.ids.iter().all(|r| r == &[6, 7]), "{:?}", o.ids);
}

#[test]
fn a_tie_for_the_kth_place_goes_to_the_higher_index_in_qwen3_moe() {
    // Experts 2 and 5 tie behind expert 0; mlx-lm's qwen3_moe takes 5.
    let o = check("tie_second");
    assert!(o.ids.iter().all(|r| r == &[0, 5]), "{:?}", o.ids);
}

#[test]
fn a_tie_for_the_kth_place_goes_to_the_lower_index_in_qwen2_moe() {
    // Same router in qwen2_moe's block (argpartition(-p)[:k]), with its shared expert.
    let o = check("tie_second_qwen2");
    assert!(o.ids.iter().all(|r| r == &[0, 2]), "{:?}", o.ids);
}

#[test]
fn top_k_equal_to_the_number_of_experts_mixes_every_expert() {
    let o = check("all_experts");
    assert!(o.ids.iter().all(|r| r == &[0, 1, 2, 3, 4, 5, 6, 7]));
}

#[test]
fn experts_never_chosen_are_never_read() {
    // Experts 3 and 6 carry NaN scales: reading them would poison the output.
    let o = check("never_chosen");
    assert!(o.ids.iter().flatten().all(|&e| e != 3 && e != 6));
    assert!(o.y.iter().all(|v| v.is_finite()));
}

#[test]
fn dense_bf16_experts_match_mlx_lm_gather_mm() {
    check("dense_bf16");
}

#[test]
fn per_expert_hugging_face_names_are_stacked_at_load() {
    // Stored as mlp.experts.{e}.*_proj.weight; top-3 without renormalization.
    check("dense_per_expert");
}
