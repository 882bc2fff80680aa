//! Helpers shared by the engine's integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

use serde_json::Value;

/// The repository root: `MLXCEL_TEST_ROOT` on the GPU machine, else found from this crate.
pub fn root() -> PathBuf {
    match std::env::var_os("MLXCEL_TEST_ROOT") {
        Some(r) => PathBuf::from(r),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.."),
    }
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

pub fn floats(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

/// Steps of a reference greedy run to trust: those before the first whose top1−top2 logit
/// margin is below `near_tie`.
pub fn trusted_steps(margins: &[f64], near_tie: f64) -> usize {
    margins.iter().position(|&m| m < near_tie).unwrap_or(margins.len())
}

/// Worst |NLL − mlx-lm's f32 NLL| allowed when activations are stored in `dtype`: the f32
/// tolerance `tol`, or about what rounding every stored activation to a 2⁻¹¹ (f16) or 2⁻⁸
/// (bf16) relative step does to the NLL of the small random-weight fixtures.
pub fn dtype_tolerance(dtype: mlxcel_core::DType, tol: f64) -> f64 {
    match dtype {
        mlxcel_core::DType::F16 => tol.max(0.05),
        mlxcel_core::DType::BF16 => tol.max(0.25),
        _ => tol,
    }
}
