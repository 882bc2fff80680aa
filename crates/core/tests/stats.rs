//! Graph statistics and DOT export on a small graph.

use mlxcel_core::stats::{stats, to_dot};
use mlxcel_core::{DType, GraphBuilder, HostTensor};

fn small_graph() -> mlxcel_core::Graph {
    let mut b = GraphBuilder::default();
    let x = b.input("x", DType::F32, &[2, 4]);
    b.set_layer(Some(3));
    let w = b.parameter("layers.3.w", HostTensor::zeros(DType::BF16, &[4]));
    let y = b.mul(x, w).unwrap(); // inserts AsType bf16 → f32 for `mul`
    let y = b.name(y, "scaled");
    let z = b.exp(y).unwrap();
    b.set_layer(None);
    let h = b.astype(z, DType::F16);
    b.finish(&[h])
}

#[test]
fn stats_count_ops_and_explain_each_astype() {
    let s = stats(&small_graph());
    assert_eq!(s.nodes, 8, "input, param, astype, reshape, broadcast, mul, exp, astype");
    assert_eq!(s.by_op["astype"], 2);
    assert_eq!(s.by_op["mul"], 1);
    let first = &s.astype[0];
    assert_eq!(
        (first.from, first.to, first.origin, first.source_op),
        (DType::BF16, DType::F32, "mul", "parameter")
    );
    assert_eq!(first.layer, Some(3));
    assert_eq!(first.tensor.as_deref(), Some("layers.3.w"));
    let last = &s.astype[1];
    assert_eq!(
        (last.from, last.to, last.origin, last.source_op, last.layer),
        (DType::F32, DType::F16, "astype", "exp", None)
    );
    let text = s.to_string();
    assert!(
        text.contains("astype bf16 → f32: 1× for mul (of parameter) in L3"),
        "{text}"
    );
}

#[test]
fn dot_has_every_node_and_edge_and_marks_astype() {
    let g = small_graph();
    let dot = to_dot(&g);
    assert!(dot.starts_with("digraph"));
    assert_eq!(dot.matches("[label=").count(), g.nodes.len() + g.outputs.len());
    let edges: usize = g.nodes.iter().map(|n| n.inputs.len()).sum::<usize>() + g.outputs.len();
    assert_eq!(dot.matches(" -> ").count(), edges);
    assert_eq!(dot.matches("color=red").count(), 2);
    assert!(dot.contains("scaled.3"), "named node shows its layer");
    assert!(dot.contains("fillcolor=\"#fdae6b\""), "bf16 nodes are coloured");
}

#[test]
fn breakdown_groups_casts_by_source_across_layers() {
    // Three layers each widen their bf16 norm weight for a `mul` (a parameter cast), and one
    // activation is narrowed at the end: two groups, the parameter one naming `layers.N`.
    let mut b = GraphBuilder::default();
    let mut x = b.input("x", DType::F32, &[1, 4]);
    for l in 0..3 {
        b.set_layer(Some(l));
        let w = b.parameter(
            &format!("model.layers.{l}.norm.weight"),
            HostTensor::zeros(DType::BF16, &[4]),
        );
        x = b.mul(x, w).unwrap();
    }
    b.set_layer(None);
    let y = b.astype(x, DType::F16);
    let s = stats(&b.finish(&[y]));
    assert_eq!(s.astype.len(), 4);
    let groups = s.astype_breakdown();
    assert_eq!(groups.len(), 2, "{groups:?}");
    let g = &groups[0];
    assert_eq!((g.count, g.from, g.to, g.origin), (3, DType::BF16, DType::F32, "mul"));
    assert_eq!(g.tensor.as_deref(), Some("model.layers.N.norm.weight"));
    assert_eq!(g.layers, vec![0, 1, 2]);
    assert_eq!(
        g.to_string(),
        "3× bf16 → f32 for mul of parameter (model.layers.N.norm.weight) in L0,L1,L2"
    );
    assert_eq!(
        (groups[1].count, groups[1].origin, groups[1].source_op),
        (1, "astype", "mul")
    );
    assert!(groups[1].layers.is_empty());
}
