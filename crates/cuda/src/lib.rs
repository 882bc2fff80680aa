//! The CUDA backend: kernels in `kernels/*.cu`, compiled at run time with NVRTC for the
//! device's architecture; device memory planned once per graph (the planner shared with the
//! CPU backend); weights uploaded once per session. Without the `cuda` feature the backend
//! still exists and answers "not compiled with CUDA support", so engine and model code carry
//! no `cfg` gates.

#[cfg(feature = "cuda")]
mod device;
pub mod pack;

#[cfg(not(feature = "cuda"))]
use mlxcel_core::Error;
use mlxcel_core::{Backend, Node, Result, Session};

/// Kernel sources, one file per op family, concatenated after the shared header.
pub const KERNEL_SOURCES: &[(&str, &str)] = &[
    ("common.cuh", include_str!("../kernels/common.cuh")),
    ("elementwise.cu", include_str!("../kernels/elementwise.cu")),
    ("reduce.cu", include_str!("../kernels/reduce.cu")),
    ("linalg.cu", include_str!("../kernels/linalg.cu")),
    ("gemv.cu", include_str!("../kernels/gemv.cu")),
    ("attention.cu", include_str!("../kernels/attention.cu")),
    ("grouped.cu", include_str!("../kernels/grouped.cu")),
    ("nn.cu", include_str!("../kernels/nn.cu")),
    ("index.cu", include_str!("../kernels/index.cu")),
    ("layout.cu", include_str!("../kernels/layout.cu")),
];

/// The whole program NVRTC compiles.
pub fn kernel_source() -> String {
    KERNEL_SOURCES
        .iter()
        .map(|(name, src)| format!("// ---- {name}\n{src}\n"))
        .collect()
}

pub struct CudaBackend {
    #[cfg(feature = "cuda")]
    gpu: std::sync::Arc<device::Gpu>,
}

impl CudaBackend {
    /// Opens GPU 0 and compiles the kernels for it.
    pub fn new() -> Result<CudaBackend> {
        #[cfg(feature = "cuda")]
        {
            Ok(CudaBackend {
                gpu: device::Gpu::open()?,
            })
        }
        #[cfg(not(feature = "cuda"))]
        {
            Err(Error::Backend(
                "mlxcel was not compiled with CUDA support (build with --features cuda)".into(),
            ))
        }
    }

    /// Compiles the kernels for `arch` here and stores them in `dir` under the name a GPU with
    /// driver version `driver` (e.g. 13000) looks for, so that machine skips the compile (a
    /// development aid for GPU machines that start cold: `MLXCEL_CACHE_DIR` points there).
    pub fn precompile_kernels(arch: &'static str, driver: i32, dir: &std::path::Path) -> Result<std::path::PathBuf> {
        #[cfg(feature = "cuda")]
        {
            let ptx = device::compile_ptx(arch)?;
            let path = dir.join(device::cache_name(arch, driver));
            std::fs::create_dir_all(dir)
                .and_then(|_| std::fs::write(&path, ptx))
                .map_err(|e| mlxcel_core::Error::Backend(format!("{}: {e}", path.display())))?;
            Ok(path)
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (arch, driver, dir);
            Err(Error::Backend(
                "mlxcel was not compiled with CUDA support (build with --features cuda)".into(),
            ))
        }
    }

    /// Kernel launches one run of `graph` makes on CUDA (a node each, fused patterns once,
    /// aliases none), as `MLXCEL_CUDA_PROFILE` counts them; needs no GPU.
    pub fn launches_per_run(graph: &mlxcel_core::Graph) -> Result<usize> {
        Ok(Self::launch_families(graph)?.iter().map(|(_, n)| n).sum())
    }

    /// The same launches by kernel family (`MLXCEL_CUDA_PROFILE`'s names), most first; needs
    /// no GPU.
    pub fn launch_families(graph: &mlxcel_core::Graph) -> Result<Vec<(String, usize)>> {
        #[cfg(feature = "cuda")]
        {
            Ok(device::launch_families(graph))
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = graph;
            Err(Error::Backend(
                "mlxcel was not compiled with CUDA support (build with --features cuda)".into(),
            ))
        }
    }

    /// Compiles every kernel to PTX for `arch` (e.g. `sm_90`) without a GPU: what CI checks.
    pub fn compile_kernels(arch: &'static str) -> Result<usize> {
        Self::kernel_ptx(arch).map(|ptx| ptx.len())
    }

    /// The PTX of every kernel for `arch`, through NVRTC (no GPU needed): for checks such as
    /// ptxas's register counts.
    pub fn kernel_ptx(arch: &'static str) -> Result<String> {
        #[cfg(feature = "cuda")]
        {
            device::compile_ptx(arch)
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = arch;
            Err(Error::Backend(
                "mlxcel was not compiled with CUDA support (build with --features cuda)".into(),
            ))
        }
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn check_supported(&self, node: &Node) -> Result<()> {
        #[cfg(feature = "cuda")]
        {
            device::check_supported(node)
        }
        #[cfg(not(feature = "cuda"))]
        {
            Err(Error::Unsupported {
                backend: "cuda",
                op: node.op.name().to_string(),
            })
        }
    }

    fn new_session(&self) -> Result<Box<dyn Session>> {
        #[cfg(feature = "cuda")]
        {
            Ok(Box::new(device::CudaSession::new(self.gpu.clone())?))
        }
        #[cfg(not(feature = "cuda"))]
        {
            Err(Error::Backend(
                "mlxcel was not compiled with CUDA support (build with --features cuda)".into(),
            ))
        }
    }

    fn copy_bandwidth(&self) -> Result<f64> {
        #[cfg(feature = "cuda")]
        {
            self.gpu.copy_bandwidth(device::bandwidth::COPY_BYTES)
        }
        #[cfg(not(feature = "cuda"))]
        {
            Err(Error::Backend("mlxcel was not compiled with CUDA support".into()))
        }
    }

    fn device_memory_used(&self) -> Result<Option<usize>> {
        #[cfg(feature = "cuda")]
        {
            self.gpu.memory_used().map(Some)
        }
        #[cfg(not(feature = "cuda"))]
        {
            Ok(None)
        }
    }
}

/// Whether every node of `graph` is one this backend can run (the checks `load` makes), without
/// a GPU: how model code checks its graphs for CUDA on any machine.
pub fn check_graph(graph: &mlxcel_core::Graph) -> Result<()> {
    #[cfg(feature = "cuda")]
    {
        graph.nodes.iter().try_for_each(|node| device::check_node(graph, node))
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = graph;
        Err(Error::Backend(
            "mlxcel was not compiled with CUDA support (build with --features cuda)".into(),
        ))
    }
}

#[cfg(all(test, not(feature = "cuda")))]
mod tests {
    #[test]
    fn says_why_it_cannot_run() {
        let err = super::CudaBackend::new()
            .err()
            .expect("no CUDA in this build")
            .to_string();
        assert!(err.contains("not compiled with CUDA support"), "{err}");
    }
}
