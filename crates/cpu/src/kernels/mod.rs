//! One file per op family. Kernels take typed views and the shapes they need; they compute
//! in f32 (floats) or i64 (integers) and round once on store.

pub mod attention;
pub mod elementwise;
pub mod index;
pub mod layout;
pub mod matmul;
pub mod norm;
pub mod quant;
pub mod reduce;
pub mod rope;

use mlxcel_core::Error;

/// Elements below which splitting work across threads costs more than it saves.
pub const PAR_MIN: usize = 1 << 14;

pub fn dtype_mismatch(op: &str) -> Error {
    Error::Unsupported {
        backend: "cpu",
        op: format!("{op} with these operand dtypes"),
    }
}

/// Expands to a match over a float view, binding the typed slice; other dtypes fail.
#[macro_export]
macro_rules! float_view {
    ($v:expr, $s:ident => $body:expr, $op:expr) => {
        match $v {
            $crate::buffer::In::F32($s) => $body,
            $crate::buffer::In::F16($s) => $body,
            $crate::buffer::In::BF16($s) => $body,
            _ => return Err($crate::kernels::dtype_mismatch($op)),
        }
    };
}
