//! The default passes keep results bit-identical: every op case, and graphs built to give each
//! pass work, run the same on the CPU before and after.

use mlxcel_core::passes::{default_passes, run_passes};
use mlxcel_core::testing::{cases, run_case, OpCase};
use mlxcel_core::{DType, GraphBuilder, HostTensor};
use mlxcel_cpu::CpuBackend;

fn assert_same_bits(case: &OpCase) {
    let before = run_case(&CpuBackend, case).unwrap_or_else(|e| panic!("{}: {e}", case.name));
    let rewritten = OpCase {
        name: case.name.clone(),
        graph: run_passes(&case.graph, &default_passes()).unwrap(),
        inputs: case.inputs.clone(),
        states: case.states.clone(),
        tolerance: case.tolerance.clone(),
    };
    let after = run_case(&CpuBackend, &rewritten).unwrap();
    for (k, (a, b)) in before.iter().zip(&after).enumerate() {
        assert_eq!(
            a.bytes(),
            b.bytes(),
            "{} output {k} changed under the passes",
            case.name
        );
    }
}

#[test]
fn passes_keep_every_op_case_bit_identical() {
    for case in cases::all() {
        assert_same_bits(&case);
    }
}

#[test]
fn folding_casts_of_weights_and_constants_keeps_bits() {
    let mut b = GraphBuilder::default();
    let x = b.input("x", DType::F32, &[3, 5]);
    let w = b.parameter(
        "w",
        HostTensor::from_f32(DType::BF16, &[5], &[0.1, -2.0, 3.3, 1e-3, 7.0]).unwrap(),
    );
    let c = b.constant(HostTensor::from_f32(DType::F16, &[5], &[1.5, 2.0, -0.25, 4.0, 1e-4]).unwrap());
    let y = b.mul(x, w).unwrap(); // AsType(w) folds into an f32 parameter
    let y = b.add(y, c).unwrap(); // AsType(c) folds into an f32 constant
    let h = b.astype(y, DType::F16);
    let back = b.astype(h, DType::F32);
    let unused = b.exp(back).unwrap();
    let _ = unused;
    let g = b.finish(&[back]);
    let folded = run_passes(&g, &default_passes()).unwrap();
    assert_eq!(
        folded.nodes.iter().filter(|n| n.op.name() == "astype").count(),
        2,
        "only the f32→f16→f32 pair is real"
    );
    let case = OpCase {
        name: "fold".into(),
        graph: g,
        inputs: vec![HostTensor::from_f32(
            DType::F32,
            &[3, 5],
            &(0..15).map(|i| i as f32 * 0.37 - 2.0).collect::<Vec<_>>(),
        )
        .unwrap()],
        states: vec![],
        tolerance: vec![mlxcel_core::testing::Tolerance::EXACT],
    };
    assert_same_bits(&case);
}

#[test]
fn transposes_of_unit_axes_become_reshapes() {
    let mut b = GraphBuilder::default();
    let x = b.input("x", DType::F32, &[1, 1, 4, 3]);
    let moved = b.swap_axes(x, 1, 2).unwrap(); // [1, 4, 1, 3]: same element order
    let y = b.input("y", DType::F32, &[1, 2, 4, 3]);
    let real = b.swap_axes(y, 1, 2).unwrap(); // [1, 4, 2, 3]: elements move
    let g = b.finish(&[moved, real]);
    let out = run_passes(&g, &default_passes()).unwrap();
    let names: Vec<&str> = out.outputs.iter().map(|o| out.node(*o).op.name()).collect();
    assert_eq!(names, ["reshape", "transpose"]);
    let case = OpCase {
        name: "unit transpose".into(),
        graph: g,
        inputs: vec![
            HostTensor::from_f32(
                DType::F32,
                &[1, 1, 4, 3],
                &(0..12).map(|i| i as f32).collect::<Vec<_>>(),
            )
            .unwrap(),
            HostTensor::from_f32(
                DType::F32,
                &[1, 2, 4, 3],
                &(0..24).map(|i| i as f32 - 5.0).collect::<Vec<_>>(),
            )
            .unwrap(),
        ],
        states: vec![],
        tolerance: vec![mlxcel_core::testing::Tolerance::EXACT; 2],
    };
    assert_same_bits(&case);
}
