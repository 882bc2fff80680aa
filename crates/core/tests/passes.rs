//! Structure of the first passes (their numerical identity is checked on the CPU backend).

use mlxcel_core::passes::{
    dead_node_elimination, dedupe_constants, fold_constant_astype, fold_constant_broadcast, remove_noop_astype,
    FOLD_BROADCAST_BYTES,
};
use mlxcel_core::{DType, Graph, GraphBuilder, HostTensor, Node, NodeId, Op};

fn count(g: &Graph, name: &str) -> usize {
    g.nodes.iter().filter(|n| n.op.name() == name).count()
}

/// An `AsType` the builder would never make (it skips same-dtype casts), pushed by hand.
fn push_cast(g: &mut Graph, x: NodeId, dtype: DType) -> NodeId {
    let shape = g.node(x).shape.clone();
    g.nodes.push(Node {
        op: Op::AsType,
        inputs: vec![x],
        shape,
        dtype,
        layer: None,
        name: None,
        origin: "test",
    });
    NodeId(g.nodes.len() as u32 - 1)
}

#[test]
fn noop_and_exact_round_trip_casts_are_removed() {
    let mut b = GraphBuilder::default();
    let x = b.input("x", DType::F16, &[4]);
    let mut g = b.finish(&[]);
    let same = push_cast(&mut g, x, DType::F16);
    let up = push_cast(&mut g, same, DType::F32);
    let back = push_cast(&mut g, up, DType::F16); // f16 → f32 → f16 is exact
    let to_bf = push_cast(&mut g, x, DType::BF16);
    let lossy = push_cast(&mut g, to_bf, DType::F16); // f16 → bf16 → f16 loses bits: keep
    g.outputs = vec![back, lossy];
    let out = dead_node_elimination(&remove_noop_astype(&g).unwrap()).unwrap();
    assert_eq!(out.outputs[0], NodeId(0), "the round trip forwards to x");
    assert_eq!(count(&out, "astype"), 2, "only the lossy pair remains");
}

#[test]
fn casts_of_constants_fold_into_the_constant() {
    let mut b = GraphBuilder::default();
    let c = b.constant(HostTensor::from_f32(DType::F32, &[3], &[1.0, 2.5, -3.0]).unwrap());
    let h = b.astype(c, DType::BF16);
    let g = b.finish(&[h]);
    let out = dead_node_elimination(&fold_constant_astype(&g).unwrap()).unwrap();
    assert_eq!(out.nodes.len(), 1);
    let Op::Constant { data } = &out.nodes[0].op else {
        panic!("expected a constant")
    };
    assert_eq!(data.dtype, DType::BF16);
    assert_eq!(data.to_f32_vec(), vec![1.0, 2.5, -3.0]);
}

#[test]
fn small_broadcasts_of_constants_fold_into_the_constant() {
    let mut b = GraphBuilder::default();
    // [2, 1, 3] → [2, 2, 3]: rows repeat along the middle axis.
    let c = b.constant(HostTensor::from_slice(&[2, 1, 3], &[1u32, 2, 3, 4, 5, 6]).unwrap());
    let y = b.broadcast_to(c, &[2, 2, 3]).unwrap();
    let g = b.finish(&[y]);
    let out = dead_node_elimination(&fold_constant_broadcast(&g).unwrap()).unwrap();
    assert_eq!(out.nodes.len(), 1);
    let Op::Constant { data } = &out.nodes[0].op else {
        panic!("expected a constant")
    };
    assert_eq!(data.shape, vec![2, 2, 3]);
    assert_eq!(data.to_vec::<u32>().unwrap(), [1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6]);

    // A scalar (reshaped to rank 2 by the builder first) folds the same way.
    let mut b = GraphBuilder::default();
    let c = b.constant(HostTensor::from_slice(&[], &[9u32]).unwrap());
    let y = b.broadcast_to(c, &[2, 3]).unwrap();
    let g = b.finish(&[y]);
    let out = dead_node_elimination(&fold_constant_broadcast(&g).unwrap()).unwrap();
    assert_eq!(count(&out, "broadcast"), 0);
    let Op::Constant { data } = &out.node(out.outputs[0]).op else {
        panic!("expected a constant")
    };
    assert_eq!(data.to_vec::<u32>().unwrap(), [9; 6]);

    // Past the size limit the broadcast stays a node (a kernel, not a stored tensor).
    let mut b = GraphBuilder::default();
    let c = b.constant(HostTensor::from_slice(&[1, 1], &[7u32]).unwrap());
    let big = FOLD_BROADCAST_BYTES / 4 + 1;
    let y = b.broadcast_to(c, &[1, big]).unwrap();
    let g = b.finish(&[y]);
    assert_eq!(count(&fold_constant_broadcast(&g).unwrap(), "broadcast"), 1);
}

#[test]
fn equal_constants_become_one_node() {
    let mut b = GraphBuilder::default();
    let x = b.input("x", DType::F32, &[3]);
    let table = |b: &mut GraphBuilder, v: [f32; 3]| b.constant(HostTensor::from_f32(DType::F32, &[3], &v).unwrap());
    let (c1, c2, c3) = (
        table(&mut b, [1.0, 2.0, 3.0]),
        table(&mut b, [1.0, 2.0, 3.0]),
        table(&mut b, [1.0, 2.0, 4.0]),
    );
    // Same bytes, other dtype: stays apart.
    let c4 = b.constant(HostTensor::from_slice(&[3], &[1f32.to_bits(), 2f32.to_bits(), 3f32.to_bits()]).unwrap());
    let (y1, y2, y3) = (b.mul(x, c1).unwrap(), b.mul(x, c2).unwrap(), b.mul(x, c3).unwrap());
    let g = b.finish(&[y1, y2, y3, c4]);
    let out = dead_node_elimination(&dedupe_constants(&g).unwrap()).unwrap();
    assert_eq!(count(&out, "constant"), 3);
    let [a, b2, c] = [0, 1, 2].map(|o| out.node(out.outputs[o]).inputs[1]);
    assert_eq!(a, b2, "equal tables are one node");
    assert_ne!(a, c);
}

#[test]
fn dead_nodes_go_but_inputs_states_and_cache_writes_stay() {
    let mut b = GraphBuilder::default();
    let x = b.input("x", DType::F32, &[1, 1, 1, 2]);
    let unused = b.input("unused", DType::F32, &[2]);
    let _dead = b.exp(unused).unwrap();
    let cache = b.state("k", DType::F32, &[1, 1, 4, 2]);
    let pos = b.input("pos", DType::I32, &[]);
    let _write = b.kv_write(cache, x, pos).unwrap();
    let y = b.exp(x).unwrap();
    let g = b.finish(&[y]);
    let out = dead_node_elimination(&g).unwrap();
    assert_eq!(count(&out, "exp"), 1);
    assert_eq!(count(&out, "input"), 3);
    assert_eq!(count(&out, "kv_write"), 1);
    assert_eq!(count(&out, "state"), 1);
    out.validate().unwrap();
}
