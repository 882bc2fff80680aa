use thiserror::Error;

/// Errors from building, rewriting or running a graph.
#[derive(Debug, Error)]
pub enum Error {
    /// A builder call got operands whose shapes do not fit the op.
    #[error("{op}: {detail}")]
    Shape { op: &'static str, detail: String },
    #[error("dtype error: {0}")]
    DType(String),
    /// The backend has no kernel for this op (never a silent fallback).
    #[error("the {backend} backend does not support {op}")]
    Unsupported { backend: &'static str, op: String },
    #[error("{0}")]
    Invalid(String),
    /// A failure while executing a planned graph (bad runtime input, index out of range, ...).
    #[error("{0}")]
    Runtime(String),
    #[error("{0}")]
    Backend(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn shape_err(op: &'static str, detail: impl Into<String>) -> Error {
    Error::Shape {
        op,
        detail: detail.into(),
    }
}
