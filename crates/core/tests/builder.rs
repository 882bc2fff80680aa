//! The builder normalizes at construction: promotion, explicit casts and broadcasts, and clear
//! errors for operands that do not fit.

use mlxcel_core::dtype::PromotionPolicy;
use mlxcel_core::{BuilderOptions, DType, Graph, GraphBuilder, HostTensor, NodeId, Op};

fn astypes(g: &Graph) -> Vec<(DType, DType, &'static str)> {
    g.nodes
        .iter()
        .filter(|n| matches!(n.op, Op::AsType))
        .map(|n| (g.node(n.inputs[0]).dtype, n.dtype, n.origin))
        .collect()
}

fn err(r: mlxcel_core::Result<NodeId>) -> String {
    r.expect_err("the builder should reject this").to_string()
}

#[test]
fn f16_plus_bf16_casts_both_to_f32() {
    let mut b = GraphBuilder::default();
    let x = b.input("x", DType::F16, &[4]);
    let y = b.input("y", DType::BF16, &[4]);
    let z = b.add(x, y).unwrap();
    assert_eq!(b.dtype(z), DType::F32);
    let g = b.finish(&[z]);
    assert_eq!(
        astypes(&g),
        vec![(DType::F16, DType::F32, "add"), (DType::BF16, DType::F32, "add")]
    );
}

#[test]
fn bf16_policy_casts_the_f32_operand_down() {
    let policy = PromotionPolicy {
        bf16_wins_over_f32: true,
    };
    let mut b = GraphBuilder::new(BuilderOptions { promotion: policy });
    let x = b.input("x", DType::BF16, &[4]);
    let y = b.input("y", DType::F32, &[4]);
    let z = b.mul(x, y).unwrap();
    assert_eq!(b.dtype(z), DType::BF16);
    assert_eq!(astypes(&b.finish(&[z])), vec![(DType::F32, DType::BF16, "mul")]);
}

#[test]
fn weak_scalars_keep_the_tensor_dtype() {
    let mut b = GraphBuilder::default();
    let x = b.input("x", DType::F16, &[2, 3]);
    let y = b.mul_scalar(x, 0.5).unwrap();
    assert_eq!(b.dtype(y), DType::F16);
    assert!(astypes(&b.finish(&[y])).is_empty());
}

#[test]
fn binary_ops_broadcast_explicitly() {
    let mut b = GraphBuilder::default();
    let x = b.input("x", DType::F32, &[3, 1]);
    let y = b.input("y", DType::F32, &[4]);
    let z = b.add(x, y).unwrap();
    assert_eq!(b.shape(z), [3, 4]);
    let g = b.finish(&[z]);
    let add = g.node(z);
    for &i in &add.inputs {
        assert_eq!(g.node(i).shape, [3, 4], "add must see same-shaped operands");
        assert!(matches!(g.node(i).op, Op::Broadcast));
    }
}

#[test]
fn elementwise_ops_never_see_mixed_dtypes_or_shapes() {
    let mut b = GraphBuilder::default();
    let a = b.input("a", DType::BF16, &[2, 1, 5]);
    let c = b.input("c", DType::F16, &[5]);
    let i = b.input("i", DType::I32, &[2, 3, 1]);
    let s = b.add(a, c).unwrap();
    let t = b.mul(s, i).unwrap();
    let cmp = b.compare(mlxcel_core::CompareOp::Lt, t, a).unwrap();
    let w = b.where_(cmp, i, c).unwrap();
    let q = b.div(i, i).unwrap();
    let g = b.finish(&[w, q]);
    for n in &g.nodes {
        if n.op.is_elementwise() && !matches!(n.op, Op::AsType) {
            let operands: Vec<_> = match n.op {
                Op::Where => n.inputs[1..].to_vec(),
                _ => n.inputs.clone(),
            };
            for &o in &operands {
                assert_eq!(g.node(o).shape, n.shape, "{} operand shape", n.op.name());
                if !matches!(n.op, Op::Compare(_)) {
                    assert_eq!(g.node(o).dtype, n.dtype, "{} operand dtype", n.op.name());
                }
            }
        }
    }
    assert_eq!(g.node(q).dtype, DType::F32, "integer division is true division");
}

#[test]
fn uint32_with_int32_is_refused_with_the_mlx_reason() {
    let mut b = GraphBuilder::default();
    let x = b.input("x", DType::U32, &[2]);
    let y = b.input("y", DType::I32, &[2]);
    let e = err(b.add(x, y));
    assert!(e.contains("int64") && e.contains("add"), "{e}");
}

#[test]
fn shape_errors_name_the_op_and_shapes() {
    let mut b = GraphBuilder::default();
    let x = b.input("x", DType::F32, &[2, 3]);
    let w = b.input("w", DType::F32, &[4, 5]);
    let e = err(b.matmul(x, w));
    assert!(
        e.starts_with("matmul:") && e.contains("[2, 3]") && e.contains("[4, 5]"),
        "{e}"
    );
    let e = err(b.reshape(x, &[7]));
    assert!(e.contains("reshape") && e.contains("[7]"), "{e}");
    let e = err(b.transpose(x, &[0, 0]));
    assert!(e.contains("transpose"), "{e}");
    let e = err(b.slice(x, &[0, 0], &[3, 3], &[1, 1]));
    assert!(e.contains("slice"), "{e}");
    let y = b.input("y", DType::F32, &[3, 3]);
    let e = err(b.concat(&[x, y], 1));
    assert!(e.contains("concat"), "{e}");
    let e = err(b.topk(x, 4));
    assert!(e.contains("topk"), "{e}");
    let e = err(b.sum(x, 2, false));
    assert!(e.contains("axis 2"), "{e}");
}

#[test]
fn quantized_matmul_checks_the_mlx_layout() {
    let mut b = GraphBuilder::default();
    let x = b.input("x", DType::F32, &[1, 64]);
    let w = b.parameter("w", HostTensor::zeros(DType::U32, &[8, 8])); // 4-bit: K = 64
    let good = b.parameter("s", HostTensor::zeros(DType::F16, &[8, 2]));
    let bad = b.parameter("s2", HostTensor::zeros(DType::F16, &[8, 3]));
    let y = b.quantized_matmul(x, w, good, good, 4, 32).unwrap();
    assert_eq!((b.shape(y), b.dtype(y)), (&[1usize, 8][..], DType::F32));
    let e = err(b.quantized_matmul(x, w, bad, bad, 4, 32));
    assert!(e.contains("scales") && e.contains("[8, 2]"), "{e}");
    let e = err(b.quantized_matmul(x, w, good, good, 3, 32));
    assert!(e.contains("3-bit"), "{e}");
    let e = err(b.quantized_matmul(x, w, good, good, 4, 48));
    assert!(e.contains("group size 48"), "{e}");
}

#[test]
fn attention_and_cache_shapes_are_checked() {
    let mut b = GraphBuilder::default();
    let q = b.input("q", DType::F32, &[1, 6, 1, 8]);
    let k = b.state("k", DType::F32, &[1, 4, 16, 8]);
    let len = b.input("len", DType::I32, &[]);
    let e = err(b.attention(q, k, k, len, 1.0, true, None, None));
    assert!(e.contains("attention"), "GQA 6/4 must be refused: {e}");
    let x = b.input("x", DType::F32, &[1, 4, 2, 8]);
    let e = err(b.kv_write(x, x, len));
    assert!(e.contains("state"), "{e}");
    let w = b.kv_write(k, x, len).unwrap();
    assert_eq!(b.shape(w), [1, 4, 16, 8]);
    let pos = b.input("pos", DType::I32, &[2]);
    let f = b.input("f", DType::F32, &[3]);
    let e = err(b.rope(x, pos, f, 7, false, 1.0));
    assert!(e.contains("even"), "{e}");
}

#[test]
fn paged_attention_checks_its_pool_table_and_blocks() {
    let mut b = GraphBuilder::default();
    let q = b.input("q", DType::F16, &[2, 8, 1, 16]);
    let pool = b.state("k", DType::F16, &[48, 2, 16]);
    let len = b.input("len", DType::I32, &[2]);
    let table = b.input("table", DType::I32, &[2, 3]);
    let y = b
        .paged_attention(q, pool, pool, len, table, 16, 0.25, true, None, None)
        .unwrap();
    assert_eq!(b.shape(y), [2, 8, 1, 16]);
    let e = err(b.paged_attention(q, pool, pool, len, table, 20, 0.25, true, None, None));
    assert!(e.contains("48 slots") && e.contains("blocks of 20"), "{e}");
    let short = b.input("short", DType::I32, &[1, 3]);
    let e = err(b.paged_attention(q, pool, pool, len, short, 16, 0.25, true, None, None));
    assert!(e.contains("block table [1, 3]"), "{e}");
    let floats = b.input("ftable", DType::F32, &[2, 3]);
    assert!(b
        .paged_attention(q, pool, pool, len, floats, 16, 0.25, true, None, None)
        .is_err());
    let dense = b.state("kd", DType::F16, &[2, 2, 48, 16]);
    let e = err(b.paged_attention(q, dense, dense, len, table, 16, 0.25, true, None, None));
    assert!(e.contains("[P, Hkv, D]"), "{e}");
    let odd = b.state("k3", DType::F16, &[48, 3, 16]);
    let e = err(b.paged_attention(q, odd, odd, len, table, 16, 0.25, true, None, None));
    assert!(e.contains("do not fit"), "GQA 8/3 must be refused: {e}");
}

#[test]
fn kv_write_casts_new_values_to_the_cache_dtype() {
    let mut b = GraphBuilder::default();
    let cache = b.state("k", DType::F16, &[1, 2, 8, 4]);
    let new = b.input("new", DType::F32, &[1, 2, 1, 4]);
    let pos = b.input("pos", DType::I32, &[]);
    let w = b.kv_write(cache, new, pos).unwrap();
    assert_eq!(astypes(&b.finish(&[w])), vec![(DType::F32, DType::F16, "kv_write")]);
}

#[test]
fn kv_write_takes_a_slot_a_token_of_the_right_shape() {
    let mut b = GraphBuilder::default();
    let cache = b.state("pool", DType::F16, &[1, 1, 32, 8]);
    let new = b.input("new", DType::F16, &[1, 1, 3, 8]);
    let slots = b.input("slots", DType::I32, &[1, 3]);
    b.kv_write(cache, new, slots).unwrap();
    let mut b = GraphBuilder::default();
    let cache = b.state("pool", DType::F16, &[1, 1, 32, 8]);
    let new = b.input("new", DType::F16, &[1, 1, 3, 8]);
    let wrong = b.input("slots", DType::I32, &[1, 4]);
    let e = err(b.kv_write(cache, new, wrong));
    assert!(e.contains("[1, 3], a slot a token"), "{e}");
    let floats = b.input("fslots", DType::F32, &[1, 3]);
    assert!(b.kv_write(cache, new, floats).is_err(), "slots must be integers");
}

#[test]
fn weight_operands_are_widened_in_kernels_not_cast() {
    // f32 activations with bf16 weights and f16 norm: no AsType, f32 result.
    let mut b = GraphBuilder::default();
    let x = b.input("x", DType::F32, &[1, 4]);
    let w = b.parameter("w", HostTensor::zeros(DType::BF16, &[3, 4]));
    let n = b.parameter("n", HostTensor::zeros(DType::F16, &[4]));
    let h = b.rms_norm(x, n, 1e-5, false).unwrap();
    let y = b.matmul_t(h, w).unwrap();
    assert_eq!(b.dtype(y), DType::F32);
    assert!(astypes(&b.finish(&[y])).is_empty());
}

#[test]
fn writes_to_one_state_form_a_chain() {
    let mut b = GraphBuilder::default();
    let cache = b.state("k", DType::F32, &[1, 1, 8, 4]);
    let new = b.input("new", DType::F32, &[1, 1, 1, 4]);
    let q = b.input("q", DType::F32, &[1, 1, 1, 4]);
    let pos = b.input("pos", DType::I32, &[]);
    let first = b.kv_write(cache, new, pos).unwrap();
    let e = err(b.kv_write(cache, new, pos));
    assert!(e.contains("later write"), "forking writes from one state: {e}");
    let e = err(b.attention(q, cache, cache, pos, 1.0, true, None, None));
    assert!(e.contains("later write"), "reading the stale cache: {e}");
    let second = b.kv_write(first, new, pos).unwrap();
    b.attention(q, second, second, pos, 1.0, true, None, None).unwrap();
}

#[test]
fn fractional_weak_scalars_promote_integer_tensors() {
    let mut b = GraphBuilder::default();
    let x = b.input("x", DType::I32, &[2]);
    let half = b.mul_scalar(x, 0.5).unwrap();
    assert_eq!(b.dtype(half), DType::F32);
    let twice = b.mul_scalar(x, 2.0).unwrap();
    assert_eq!(b.dtype(twice), DType::I32);
}
