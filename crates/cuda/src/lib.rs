//! The CUDA backend. Until it is written (see the CUDA backend issue) this crate answers every
//! request with a clear error, with or without the `cuda` feature, so that engine and model
//! code never need `cfg` gates.

use mlxcel_core::{Backend, Error, Node, Result, Session};

pub struct CudaBackend {
    _private: (),
}

fn unavailable() -> Error {
    if cfg!(feature = "cuda") {
        Error::Backend("the CUDA backend is not implemented yet in this build of mlxcel".into())
    } else {
        Error::Backend("mlxcel was not compiled with CUDA support (build with --features cuda)".into())
    }
}

impl CudaBackend {
    /// Opens the first GPU.
    pub fn new() -> Result<CudaBackend> {
        Err(unavailable())
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn check_supported(&self, node: &Node) -> Result<()> {
        Err(Error::Unsupported {
            backend: "cuda",
            op: node.op.name().to_string(),
        })
    }

    fn new_session(&self) -> Result<Box<dyn Session>> {
        Err(unavailable())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn says_why_it_cannot_run() {
        let err = super::CudaBackend::new()
            .err()
            .expect("no CUDA backend yet")
            .to_string();
        assert!(err.contains("CUDA"), "{err}");
    }
}
