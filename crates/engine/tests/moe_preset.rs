//! The `qwen3-30b-a3b-4bit` preset: real Qwen3-30B-A3B shapes in the mlx-community layout. The
//! full 48 layers are ~17 GB of random 4-bit weights, too big for a test; two layers of the same
//! widths build, pass the CUDA backend's support checks, and decode on the CPU.

use mlxcel_core::{DType, GraphBuilder};
use mlxcel_engine::{Engine, GenerateOptions, SamplerSettings};
use mlxcel_models::synth::{self, Preset};
use mlxcel_models::StepInputs;
use serde_json::{json, Value};

const NAME: &str = "qwen3-30b-a3b-4bit";

fn two_layers() -> Value {
    let mut c = (synth::preset(NAME).unwrap().config)();
    c["num_hidden_layers"] = json!(2);
    c
}

fn scaled() -> Preset {
    Preset {
        name: "qwen3-30b-a3b-4bit, 2 layers",
        config: two_layers,
        quant: synth::preset(NAME).unwrap().quant,
    }
}

#[test]
fn the_preset_has_qwen3_30b_a3b_shapes() {
    let spec = mlxcel_models::spec_for(&(synth::preset(NAME).unwrap().config)()).unwrap();
    let moe = spec.moe.as_ref().unwrap();
    assert_eq!(
        (
            spec.layers,
            spec.hidden,
            spec.heads,
            spec.kv_heads,
            spec.head_dim,
            spec.vocab
        ),
        (48, 2048, 32, 4, 128, 151936)
    );
    assert_eq!((moe.experts, moe.top_k, moe.intermediate), (128, 8, 768));
    assert!(moe.norm_topk_prob && (0..48).all(|i| moe.is_sparse(i)));
}

#[test]
fn the_scaled_preset_is_laid_out_like_mlx_community_and_decodes() {
    let m = synth::tensors(&scaled(), 7).unwrap();
    let shape = |n: &str| m.tensors.iter().find(|(k, _)| k == n).map(|(_, t)| t.shape.clone());
    let sm = "model.layers.1.mlp.switch_mlp";
    assert_eq!(shape(&format!("{sm}.gate_proj.weight")), Some(vec![128, 768, 256]));
    assert_eq!(shape(&format!("{sm}.down_proj.scales")), Some(vec![128, 2048, 12]));
    // The router stays at 8 bits, as mlx-lm's qwen3_moe quant_predicate leaves it.
    assert_eq!(shape("model.layers.0.mlp.gate.weight"), Some(vec![128, 512]));
    assert_eq!(m.modules["model.layers.0.mlp.gate"].bits, 8);
    assert_eq!(m.modules[&format!("{sm}.up_proj")].bits, 4);
    drop(m);

    let model = synth::load(&scaled(), 7).unwrap();
    // Decode and prefill graphs in bf16 (what CUDA runs) pass the CUDA support checks.
    for t in [1, 16] {
        let mut b = GraphBuilder::default();
        let tokens = b.input("tokens", DType::I32, &[1, t]);
        let positions = b.input("positions", DType::I32, &[t]);
        let offset = b.input("offset", DType::I32, &[]);
        let kv_len = b.add_scalar(offset, t as f32).unwrap();
        let inputs = StepInputs {
            tokens,
            positions,
            offset,
            kv_len,
            tokens_len: t,
            capacity: 256,
            dtype: DType::BF16,
            last_only: true,
        };
        let logits = model.forward(&mut b, &inputs).unwrap();
        let graph = b.finish(&[logits]);
        assert!(graph.nodes.iter().any(|n| n.op.name() == "gather_qmm"));
        mlxcel_core::backend::check_graph(&mlxcel_cpu::CpuBackend, &graph).unwrap();
        match mlxcel_cuda::check_graph(&graph) {
            Err(e) if e.to_string().contains("not compiled with CUDA") => {
                eprintln!("skipping the CUDA support check: {e}")
            }
            r => r.unwrap_or_else(|e| panic!("T = {t}: {e}")),
        }
    }

    let mut e = Engine::new(model, Box::new(mlxcel_cpu::CpuBackend), DType::F32, Some(64)).unwrap();
    let opts = GenerateOptions {
        max_tokens: 3,
        sampler: SamplerSettings::default(),
        prefill_chunk: 512,
    };
    let g = e.generate(&[1, 2, 3, 4], &opts, &|_| false, |_| Ok(true)).unwrap();
    assert_eq!(g.tokens.len(), 3);
    assert!(g.tokens.iter().all(|&t| (t as usize) < 151936));
}
