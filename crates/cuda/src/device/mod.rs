//! The real CUDA backend (feature `cuda`): one context and stream on GPU 0, one NVRTC-compiled
//! module, sessions holding planned device buffers. Kernel arguments are raw device pointers
//! taken once at load: every buffer lives as long as its session and never moves.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaGraph, CudaModule, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use mlxcel_core::backend::{check_inputs, CompileOptions, GraphId, MemoryReport, StateTable};
use mlxcel_core::plan::{self, Loc, Plan};
use mlxcel_core::tensor::Storage;
use mlxcel_core::{DType, Error, Graph, HostTensor, Node, NodeName, Op, Result, Session};

fn driver_err(e: impl std::fmt::Debug) -> Error {
    Error::Backend(format!("CUDA: {e:?}"))
}

/// Compiles the kernel program for `arch` with NVRTC.
pub fn compile_ptx(arch: &'static str) -> Result<String> {
    // SAFETY: only probes whether the library loads (cudarc would panic on first use otherwise).
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(Error::Backend(
            "NVRTC (libnvrtc) was not found: set LD_LIBRARY_PATH to a CUDA 13 install".into(),
        ));
    }
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        options: vec!["--std=c++17".into()],
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(crate::kernel_source(), opts)
        .map_err(|e| Error::Backend(format!("NVRTC could not compile the kernels for {arch}: {e:?}")))?;
    Ok(ptx.to_src())
}

/// Launches one run of `graph` makes (see `CudaBackend::launches_per_run`): what `run_nodes`
/// launches, without a device.
#[cfg(test)]
pub fn launches_per_run(graph: &Graph) -> usize {
    launch_families(graph).iter().map(|(_, n)| n).sum()
}

/// The launches of one run of `graph` by kernel family (as `MLXCEL_CUDA_PROFILE` names them),
/// most first, without a device.
pub fn launch_families(graph: &Graph) -> Vec<(String, usize)> {
    let fusion = fuse::Fusion::find(graph);
    let mut counts: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        if launches(&node.op) && !fusion.absorbed[i] {
            *counts
                .entry(profile::family(graph, i, fusion.anchored[i].as_ref()))
                .or_default() += 1;
        }
    }
    let mut families: Vec<(String, usize)> = counts.into_iter().collect();
    families.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    families
}

/// Whether a node of `op` runs a kernel (leaves are resident, reshapes alias).
fn launches(op: &Op) -> bool {
    !matches!(
        op,
        Op::Parameter { .. } | Op::Constant { .. } | Op::State { .. } | Op::Reshape | Op::Input { .. }
    )
}

/// The cache file name of the kernels' PTX for `arch` under driver version `driver`.
pub fn cache_name(arch: &str, driver: i32) -> String {
    format!(
        "ptx-{arch}-{driver}-{:016x}.ptx",
        fnv1a(crate::kernel_source().as_bytes())
    )
}

/// The kernels already compiled for `arch` by ptxas, where the cache holds them beside the PTX
/// (the PTX's file name with `.cubin` for `.ptx`; scripts/gpu/README.md writes one): loading
/// them skips the driver's compile of the PTX, about 70 s on a machine that has not run this
/// source before. None where there is none; one the driver refuses falls back to the PTX.
fn cached_cubin(arch: &'static str) -> Option<Vec<u8>> {
    let name = cache_name(arch, driver_version()).replace(".ptx", ".cubin");
    std::fs::read(cache_dir()?.join(name)).ok()
}

/// The CUDA driver's version (13000 for 13.0), part of the kernel cache's key.
fn driver_version() -> i32 {
    let mut driver = 0;
    // SAFETY: writes one int; the driver library was probed before.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver) };
    driver
}

/// Where compiled kernels are kept: `MLXCEL_CACHE_DIR`, else `$XDG_CACHE_HOME/mlxcel`, else
/// `~/.cache/mlxcel`.
fn cache_dir() -> Option<std::path::PathBuf> {
    std::env::var_os("MLXCEL_CACHE_DIR")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| std::path::PathBuf::from(d).join("mlxcel")))
        .or_else(|| std::env::var_os("HOME").map(|d| std::path::PathBuf::from(d).join(".cache/mlxcel")))
}

/// The kernels' PTX for `arch`, from the disk cache when the same source was compiled for the
/// same arch under the same driver before (`MLXCEL_CACHE_DIR`, else `$XDG_CACHE_HOME/mlxcel`,
/// else `~/.cache/mlxcel`); compiled with NVRTC and stored otherwise. A cache that cannot be
/// read or written is only slower.
fn cached_ptx(arch: &'static str) -> Result<String> {
    let key = cache_name(arch, driver_version());
    let dir = cache_dir();
    if let Some(dir) = &dir {
        if let Ok(ptx) = std::fs::read_to_string(dir.join(&key)) {
            return Ok(ptx);
        }
    }
    let ptx = compile_ptx(arch)?;
    if let Some(dir) = &dir {
        let tmp = dir.join(format!("{key}.{}", std::process::id()));
        let stored = std::fs::create_dir_all(dir)
            .and_then(|_| std::fs::write(&tmp, &ptx))
            .and_then(|_| std::fs::rename(&tmp, dir.join(&key)));
        if stored.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok(ptx)
}

/// cuBLAS on `stream` with a 32 MiB workspace, or None (with a notice) where libcublas is missing:
/// large products then take the plain kernels, which are correct but much slower.
fn open_blas(stream: &Arc<CudaStream>) -> Option<(cudarc::cublas::CudaBlas, CudaSlice<u8>)> {
    if std::env::var("MLXCEL_CUBLAS").is_ok_and(|v| v == "0") {
        return None;
    }
    // SAFETY: only probes whether the library loads (cudarc would panic on first use otherwise).
    if !unsafe { cudarc::cublas::sys::is_culib_present() } {
        eprintln!("mlxcel: libcublas was not found; prefill products use the plain CUDA kernels (slow)");
        return None;
    }
    let blas = match cudarc::cublas::CudaBlas::new(stream.clone()) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("mlxcel: cuBLAS could not start ({e:?}); prefill products use the plain CUDA kernels");
            return None;
        }
    };
    let workspace = stream.alloc_zeros::<u8>(32 << 20).ok()?;
    let ptr = workspace.device_ptr(stream).0;
    // SAFETY: the workspace lives as long as the handle (both in `Gpu`).
    let set = unsafe { cudarc::cublas::sys::cublasSetWorkspace_v2(*blas.handle(), ptr as *mut _, 32 << 20) };
    (set == cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS).then_some((blas, workspace))
}

/// 64-bit FNV-1a: a stable hash of the kernel source for the cache key.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

pub struct Gpu {
    stream: Arc<CudaStream>,
    /// cuBLAS for large products (prefill), when libcublas loads; its workspace is fixed so that
    /// captured graphs never allocate.
    blas: Option<(cudarc::cublas::CudaBlas, CudaSlice<u8>)>,
    module: Arc<CudaModule>,
    funcs: std::sync::Mutex<HashMap<&'static str, CudaFunction>>,
    /// Streaming multiprocessors of the device.
    sms: u32,
    /// Whether the device launches thread-block clusters (compute capability 9.0 and up).
    clusters: bool,
    /// Tile-packed copies of 4-bit weights, scales and biases (`MLXCEL_TC_PACK=1`, pack.rs) by
    /// the device address of the row-major upload they copy; a session removes its own when it
    /// ends, before its buffers are freed.
    packed: std::sync::Mutex<HashMap<u64, u64>>,
}

/// `MLXCEL_TC_DB_GLU`: `0` never takes the double-buffered batch-1 GLU, `1` always does; unset,
/// [`Gpu::launch_gemv`] decides by rounds of tiles.
fn double_buffered_on() -> Option<bool> {
    static ON: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *ON.get_or_init(|| launch::env_usize("MLXCEL_TC_DB_GLU").map(|v| v != 0))
}

/// The double-buffered form of batch-1 tensor-core GLU `name` (`_db`: gemv.cu tc_qdot's DB,
/// which requests a warp's next chunk of weights before the products of this one), if it has
/// one. It holds about 156 registers a thread against 95, so fewer blocks fit an SM, and
/// [`Gpu::launch_gemv`] takes it where that costs no extra round of tiles on the resident
/// blocks. Measured (H100, session 20): qwen3-8b +4.6% (768 tiles, two rounds either way);
/// llama-3.1-8b -0.3% (896 tiles: three rounds against two), where the rule keeps the plain one.
fn double_buffered(name: &str) -> Option<&'static str> {
    match name {
        "tc_qglu_f16_4" => Some("tc_qglu_f16_4_db"),
        "tc_qglu_bf16_4" => Some("tc_qglu_bf16_4_db"),
        _ => None,
    }
}

impl Gpu {
    pub fn open() -> Result<Arc<Gpu>> {
        // SAFETY: only probes whether the driver library loads (cudarc would panic on first use).
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::Backend("no CUDA driver (libcuda) on this machine".into()));
        }
        let ctx = CudaContext::new(0).map_err(|e| Error::Backend(format!("no usable CUDA device: {e:?}")))?;
        let (major, minor) = ctx.compute_capability().map_err(driver_err)?;
        let arch: &'static str = Box::leak(format!("sm_{major}{minor}").into_boxed_str());
        let module = match cached_cubin(arch).map(|c| ctx.load_module(cudarc::nvrtc::Ptx::from_binary(c))) {
            Some(Ok(module)) => module,
            _ => ctx
                .load_module(cudarc::nvrtc::Ptx::from_src(cached_ptx(arch)?))
                .map_err(driver_err)?,
        };
        // One stream, so the automatic cross-stream event tracking has nothing to do.
        // SAFETY: no buffer of this context is used from a second stream.
        unsafe { ctx.disable_event_tracking() };
        // A stream of our own: the legacy default stream cannot be captured into a CUDA graph.
        let stream = ctx.new_stream().map_err(driver_err)?;
        let blas = open_blas(&stream);
        let sms = ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver_err)? as u32;
        Ok(Arc::new(Gpu {
            blas,
            stream,
            module,
            funcs: Default::default(),
            sms,
            clusters: major >= 9,
            packed: Default::default(),
        }))
    }

    fn func(&self, name: &'static str) -> Result<CudaFunction> {
        let mut funcs = self.funcs.lock().expect("kernel table lock");
        if let Some(f) = funcs.get(name) {
            return Ok(f.clone());
        }
        let f = self
            .module
            .load_function(name)
            .map_err(|e| Error::Backend(format!("kernel {name}: {e:?}")))?;
        funcs.insert(name, f.clone());
        Ok(f)
    }

    fn alloc(&self, bytes: usize) -> Result<CudaSlice<u8>> {
        self.stream.alloc_zeros::<u8>(bytes.max(1)).map_err(|e| {
            let free = cudarc::driver::result::mem_get_info().map(|(f, _)| f).unwrap_or(0);
            Error::Backend(format!("out of GPU memory: needed {bytes} bytes, {free} free ({e:?})"))
        })
    }

    fn ptr(&self, s: &CudaSlice<u8>) -> u64 {
        s.device_ptr(&self.stream).0
    }

    /// The tile-packed copies of a 4-bit weight's words, scales and biases at these row-major
    /// addresses, where the session made them (all three or none).
    pub(crate) fn packed(&self, w: u64, s: u64, z: u64) -> Option<[u64; 3]> {
        let map = self.packed.lock().expect("packed weights lock");
        Some([*map.get(&w)?, *map.get(&s)?, *map.get(&z)?])
    }
}

/// Float dtype codes of `ldf`/`stf` in common.cuh.
fn fcode(d: DType) -> Result<i32> {
    match d {
        DType::F32 => Ok(0),
        DType::F16 => Ok(1),
        DType::BF16 => Ok(2),
        other => Err(Error::Unsupported {
            backend: "cuda",
            op: format!("float kernel on {other}"),
        }),
    }
}

/// Any-dtype codes of `ld_any`/`astype_any`.
fn acode(d: DType) -> i32 {
    match d {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
        DType::I32 => 3,
        DType::U32 => 4,
        DType::U8 => 5,
        DType::Bool => 6,
    }
}

/// Index kinds of `ld_index`.
fn icode(d: DType) -> Result<i32> {
    match d {
        DType::I32 => Ok(0),
        DType::U32 => Ok(1),
        DType::U8 => Ok(2),
        other => Err(Error::Unsupported {
            backend: "cuda",
            op: format!("indices of dtype {other}"),
        }),
    }
}

fn fsuffix(d: DType) -> Result<&'static str> {
    Ok(match fcode(d)? {
        0 => "f32",
        1 => "f16",
        _ => "bf16",
    })
}

/// Rows sorted per thread by `argsort_rows`; longer rows need a real sort kernel.
const MAX_SORT: usize = 8192;
/// Query rows keep their scores in 48 KB of shared memory.
const MAX_ATTENTION_KEYS: usize = 12288;

pub fn check_supported(node: &Node) -> Result<()> {
    let float = node.dtype.is_float();
    let ok = match &node.op {
        Op::Unary(u) => float || (node.dtype == DType::I32 && !u.needs_float()),
        Op::Binary(_) => float || matches!(node.dtype, DType::I32 | DType::U32),
        Op::Softmax { .. } | Op::CumSum { .. } | Op::RmsNorm { .. } | Op::LayerNorm { .. } | Op::Rope { .. } => float,
        Op::MatMul { .. } | Op::QuantizedMatMul { .. } | Op::GatherQuantizedMatMul { .. } => float,
        Op::Attention { .. } | Op::PagedAttention { .. } | Op::QuantizedGather { .. } => float,
        Op::Reduce { .. } => float || node.dtype == DType::U32,
        _ => true,
    };
    if ok {
        Ok(())
    } else {
        Err(Error::Unsupported {
            backend: "cuda",
            op: format!("{} producing {}", node.op.name(), node.dtype),
        })
    }
}

/// Checks that need the graph (operand dtypes and sizes).
pub fn check_node(graph: &Graph, node: &Node) -> Result<()> {
    check_supported(node)?;
    let input = |k: usize| graph.node(node.inputs[k]);
    let bad = |why: String| {
        Err(Error::Unsupported {
            backend: "cuda",
            op: format!("{}: {why}", node.op.name()),
        })
    };
    match &node.op {
        Op::Reduce { .. } | Op::TopK { .. } | Op::ArgSort { .. } | Op::SampleCategorical { .. }
            if !input(0).dtype.is_float() =>
        {
            bad(format!("{} input", input(0).dtype))
        }
        Op::TopK { .. } | Op::ArgSort { .. } if *input(0).shape.last().unwrap_or(&0) > MAX_SORT => {
            bad(format!("rows longer than {MAX_SORT}"))
        }
        Op::Attention { .. } if input(1).shape[2] > MAX_ATTENTION_KEYS => {
            bad(format!("more than {MAX_ATTENTION_KEYS} cached keys"))
        }
        Op::PagedAttention { block_size, .. } if input(4).shape[1] * block_size > MAX_ATTENTION_KEYS => {
            bad(format!("more than {MAX_ATTENTION_KEYS} positions a row"))
        }
        Op::QuantizedMatMul { .. } | Op::GatherQuantizedMatMul { .. } if input(2).dtype != input(3).dtype => {
            bad("scales and biases of different dtypes".into())
        }
        Op::QuantizedGather { .. } if input(1).dtype != input(2).dtype => {
            bad("scales and biases of different dtypes".into())
        }
        Op::LayerNorm {
            has_weight: true,
            has_bias: true,
            ..
        } if input(1).dtype != input(2).dtype => bad("weight and bias of different dtypes".into()),
        Op::Attention { .. } | Op::PagedAttention { .. } if input(1).dtype != input(2).dtype => {
            bad("k and v of different dtypes".into())
        }
        Op::Binary(_) | Op::Unary(_) if node.dtype == DType::U8 => bad("uint8 arithmetic".into()),
        _ => Ok(()),
    }
}

type States = StateTable<CudaSlice<u8>>;

/// Captures a graph may fail before it runs eagerly for good.
const CAPTURE_TRIES: usize = 3;

/// A captured and instantiated CUDA graph.
struct Captured(CudaGraph);

// SAFETY: CUDA graph objects may move between threads; they must not be used from two threads at
// once, and only the owning session touches this one, through `&mut self`.
unsafe impl Send for Captured {}

struct Loaded {
    graph: Graph,
    /// Times this graph ran; the second run captures it.
    runs: usize,
    /// The captured kernel sequence, replayed by every later run.
    exec: Option<Captured>,
    /// Captures that failed (another thread's implicit synchronization, a free say, invalidates
    /// one); after `CAPTURE_TRIES` the graph stays eager.
    capture_failures: usize,
    plan: Plan,
    /// Device pointer of each leaf (parameter or constant) of this graph.
    leaves: Vec<u64>,
    slots: Vec<CudaSlice<u8>>,
    /// Patterns run as one fused kernel.
    fusion: fuse::Fusion,
    /// Per-node scratch (argsort; expanded weights of large products, shared by all of them).
    scratch: HashMap<usize, u64>,
    scratch_bufs: Vec<CudaSlice<u8>>,
    keep_named: bool,
}

pub struct CudaSession {
    gpu: Arc<Gpu>,
    states: States,
    /// By id; None once unloaded.
    graphs: Vec<Option<Loaded>>,
    /// Weights uploaded once per session, shared by every graph that names the same bytes.
    uploads: Vec<(Storage, CudaSlice<u8>)>,
    /// Tile-packed copies of some of them (`Gpu::packed`), by the row-major address.
    packed: Vec<(u64, CudaSlice<u8>)>,
    /// Set by kernels that meet an out-of-range index (to the failing node's index + 1).
    error: CudaSlice<i32>,
    /// Capture each graph into a CUDA graph on its second run (`MLXCEL_CUDA_GRAPH=0`: never).
    capture: bool,
    /// Per-kernel timing with events (`MLXCEL_CUDA_PROFILE=1`); runs stay eager.
    profile: Option<profile::Profiler>,
}

impl CudaSession {
    pub fn new(gpu: Arc<Gpu>) -> Result<CudaSession> {
        let error = gpu.stream.alloc_zeros::<i32>(1).map_err(driver_err)?;
        let profile = profile::Profiler::from_env();
        Ok(CudaSession {
            capture: std::env::var("MLXCEL_CUDA_GRAPH").map_or(true, |v| v != "0") && profile.is_none(),
            profile,
            gpu,
            states: States::default(),
            graphs: Vec::new(),
            uploads: Vec::new(),
            packed: Vec::new(),
            error,
        })
    }

    fn upload(&mut self, t: &HostTensor) -> Result<u64> {
        if let Some((_, buf)) = self.uploads.iter().find(|(s, _)| s.same_as(&t.data)) {
            return Ok(self.gpu.ptr(buf));
        }
        let mut buf = self.gpu.alloc(t.bytes().len())?;
        if !t.bytes().is_empty() {
            self.gpu.stream.memcpy_htod(t.bytes(), &mut buf).map_err(driver_err)?;
        }
        let p = self.gpu.ptr(&buf);
        self.uploads.push((t.data.clone(), buf));
        Ok(p)
    }

    /// With `MLXCEL_TC_PACK=1`, tile-packed copies (pack.rs) of the weight, scales and biases
    /// of each 4-bit product of `graph` whose shape allows them, beside the row-major uploads:
    /// the tensor-core GEMV reads those, every other kernel the row-major ones. An experiment
    /// (the weights' memory is held twice), off by default.
    fn pack_weights(&mut self, graph: &Graph) -> Result<()> {
        static PACK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if !launch::switch(&PACK, "MLXCEL_TC_PACK", false) {
            return Ok(());
        }
        let leaf = |id: mlxcel_core::NodeId| leaf_data(graph.node(id));
        for node in &graph.nodes {
            let Op::QuantizedMatMul { bits: 4, group_size } = node.op else {
                continue;
            };
            let (Some(w), Some(sc), Some(bi)) = (leaf(node.inputs[1]), leaf(node.inputs[2]), leaf(node.inputs[3]))
            else {
                continue;
            };
            let (n, k) = match w.shape[..] {
                [n, words] => (n, words * 8),
                _ => continue,
            };
            let sixteen = matches!(sc.dtype, DType::F16 | DType::BF16) && bi.dtype == sc.dtype;
            if !sixteen || !crate::pack::packable(n, k, group_size) || w.dtype != DType::U32 {
                continue;
            }
            self.upload_packed(w, |bytes| {
                let words: Vec<u32> = bytes
                    .chunks_exact(4)
                    .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
                    .collect();
                crate::pack::pack_q4_words(&words, n, k)
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect()
            })?;
            for t in [sc, bi] {
                self.upload_packed(t, |bytes| {
                    let vals: Vec<u16> = bytes
                        .chunks_exact(2)
                        .map(|b| u16::from_le_bytes([b[0], b[1]]))
                        .collect();
                    let packed = crate::pack::pack_q4_groups(&vals, n, k, group_size);
                    packed.iter().flat_map(|v| v.to_le_bytes()).collect()
                })?;
            }
        }
        Ok(())
    }

    /// Uploads `pack(t's bytes)`, the packed copy of `t` (uploaded itself first), once per
    /// session: a weight that every graph of the session names is reordered only the first time.
    fn upload_packed(&mut self, t: &HostTensor, pack: impl FnOnce(&[u8]) -> Vec<u8>) -> Result<()> {
        let key = self.upload(t)?;
        if self.packed.iter().any(|(k, _)| *k == key) {
            return Ok(());
        }
        let bytes = pack(t.bytes());
        let mut buf = self.gpu.alloc(bytes.len())?;
        self.gpu.stream.memcpy_htod(&bytes, &mut buf).map_err(driver_err)?;
        let p = self.gpu.ptr(&buf);
        self.gpu.packed.lock().expect("packed weights lock").insert(key, p);
        self.packed.push((key, buf));
        Ok(())
    }

    fn download(&self, ptr_of: &dyn Fn(usize) -> u64, g: &Loaded, i: usize) -> Result<HostTensor> {
        let node = &g.graph.nodes[i];
        let n = bytes_of(node);
        let mut host = vec![0u8; n];
        if n > 0 {
            // SAFETY: the pointer names a live buffer of this session holding at least n bytes.
            unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut host, ptr_of(i)) }.map_err(driver_err)?;
        }
        HostTensor::from_bytes(node.dtype, node.shape.clone(), Storage::from_vec(host))
    }
}

/// The tensor a weight or constant node holds.
fn leaf_data(node: &Node) -> Option<&HostTensor> {
    match &node.op {
        Op::Parameter { data, .. } | Op::Constant { data } => Some(data),
        _ => None,
    }
}

fn bytes_of(node: &Node) -> usize {
    node.shape.iter().product::<usize>() * node.dtype.size()
}

/// Queues every kernel of `g` on the stream, timing each with events when profiling.
fn launch_all(
    gpu: &Gpu,
    g: &Loaded,
    states: &States,
    error_ptr: u64,
    mut profile: Option<(&mut profile::Profiler, usize)>,
) -> Result<()> {
    for (i, node) in g.graph.nodes.iter().enumerate() {
        if !launches(&node.op) || g.fusion.absorbed[i] {
            continue;
        }
        let ptr = |k: usize| loc_ptr(gpu, g.plan.locs[node.inputs[k].index()], g, states);
        let out = loc_ptr(gpu, g.plan.locs[i], g, states);
        let scratch = g.scratch.get(&i).copied().unwrap_or(0);
        if let Some((p, _)) = profile.as_mut() {
            p.before(gpu, profile::family(&g.graph, i, g.fusion.anchored[i].as_ref()))?;
        }
        match &g.fusion.anchored[i] {
            Some(f) => launch::fused(
                gpu,
                &g.graph,
                i,
                f,
                &|j| loc_ptr(gpu, g.plan.locs[j], g, states),
                scratch,
                error_ptr,
                i as i32 + 1,
            )?,
            None => launch::node(
                gpu,
                &g.graph,
                i,
                &ptr,
                out,
                scratch,
                error_ptr,
                i as i32 + 1,
                false,
                None,
            )?,
        }
        if let Some((p, _)) = profile.as_mut() {
            p.after(gpu)?;
        }
    }
    if let Some((p, graph)) = profile {
        p.finish_run(gpu, graph)?;
    }
    Ok(())
}

fn loc_ptr(gpu: &Gpu, loc: Loc, g: &Loaded, states: &States) -> u64 {
    match loc {
        Loc::Slot(s) => gpu.ptr(&g.slots[s]),
        Loc::Leaf(l) => g.leaves[l],
        Loc::State(s) => gpu.ptr(&states.get(s).buf),
    }
}

impl Session for CudaSession {
    fn backend_name(&self) -> &'static str {
        "cuda"
    }

    fn load(&mut self, graph: &Graph, options: CompileOptions) -> Result<GraphId> {
        graph.validate()?;
        for node in &graph.nodes {
            check_node(graph, node)?;
        }
        self.pack_weights(graph)?;
        let mut state_of = vec![0; graph.nodes.len()];
        let mut leaf_of = vec![0; graph.nodes.len()];
        let mut leaves = Vec::new();
        // Named values are read back one by one, so a graph loaded to keep them runs unfused.
        let fusion = if options.keep_named {
            fuse::Fusion::none(graph.nodes.len())
        } else {
            fuse::Fusion::find(graph)
        };
        let mut scratch = HashMap::new();
        let mut scratch_bufs = Vec::new();
        let mut gemm_scratch = 0;
        let blas = self.gpu.blas.is_some();
        for (i, node) in graph.nodes.iter().enumerate() {
            match &node.op {
                Op::State { .. } => {
                    let gpu = self.gpu.clone();
                    state_of[i] = self.states.declare(node, |bytes| gpu.alloc(bytes))?
                }
                Op::Parameter { data, .. } | Op::Constant { data } => {
                    leaf_of[i] = leaves.len();
                    leaves.push(self.upload(data).map_err(|e| {
                        let total: usize = graph.nodes.iter().filter_map(leaf_data).map(|d| d.bytes().len()).sum();
                        Error::Backend(format!(
                            "{e}; the model's weights and constants need {total} bytes in all"
                        ))
                    })?);
                }
                Op::TopK { .. } | Op::ArgSort { .. } => {
                    let n: usize = graph.node(node.inputs[0]).shape.iter().product();
                    let buf = self.gpu.alloc(n * 4)?;
                    scratch.insert(i, self.gpu.ptr(&buf));
                    scratch_bufs.push(buf);
                }
                _ => {}
            }
            let fused_bytes = fusion.anchored[i]
                .as_ref()
                .and_then(|f| launch::fused_scratch(graph, f));
            if let Some(bytes) = launch::partials_scratch(graph, i).or(fused_bytes) {
                let buf = self.gpu.alloc(bytes)?;
                scratch.insert(i, self.gpu.ptr(&buf));
                scratch_bufs.push(buf);
            }
            gemm_scratch = gemm_scratch.max(launch::shared_scratch_bytes(graph, i, blas, &fusion));
        }
        if gemm_scratch > 0 {
            let buf = self.gpu.alloc(gemm_scratch)?;
            for (i, _) in graph.nodes.iter().enumerate() {
                if launch::shared_scratch_bytes(graph, i, blas, &fusion) > 0 {
                    scratch.insert(i, self.gpu.ptr(&buf));
                }
            }
            scratch_bufs.push(buf);
        }
        let planned = fusion.planning_graph(graph);
        let plan = plan::plan(&planned, options.keep_named, |i| state_of[i], |i| leaf_of[i]);
        let slots = plan
            .slot_bytes
            .iter()
            .map(|&b| self.gpu.alloc(b))
            .collect::<Result<Vec<_>>>()
            .map_err(|e| {
                let total: usize = plan.slot_bytes.iter().sum();
                let buffers = plan.slot_bytes.len();
                Error::Backend(format!(
                    "{e}; this step's activations need {total} bytes in {buffers} buffers"
                ))
            })?;
        self.graphs.push(Some(Loaded {
            graph: graph.clone(),
            plan,
            leaves,
            slots,
            scratch,
            scratch_bufs,
            fusion,
            keep_named: options.keep_named,
            runs: 0,
            exec: None,
            capture_failures: 0,
        }));
        Ok(GraphId(self.graphs.len() - 1))
    }

    fn run(&mut self, id: GraphId, inputs: &[HostTensor]) -> Result<Vec<HostTensor>> {
        let gpu = self.gpu.clone();
        let g = self
            .graphs
            .get_mut(id.0)
            .and_then(Option::as_mut)
            .ok_or_else(|| Error::Invalid(format!("no graph {} in this session", id.0)))?;
        check_inputs(&g.graph, inputs)?;
        let error_ptr = gpu.ptr_i32(&self.error);
        let mut next_input = 0;
        for (i, node) in g.graph.nodes.iter().enumerate() {
            if !matches!(node.op, Op::Input { .. }) {
                continue;
            }
            let Loc::Slot(s) = g.plan.locs[i] else {
                unreachable!("inputs are planned into slots")
            };
            let bytes = inputs[next_input].bytes();
            next_input += 1;
            if !bytes.is_empty() {
                let mut view = g.slots[s].slice_mut(0..bytes.len());
                gpu.stream.memcpy_htod(bytes, &mut view).map_err(driver_err)?;
            }
        }
        if g.exec.is_none() && self.capture && g.runs >= 1 && g.capture_failures < CAPTURE_TRIES {
            // Capture the kernel sequence once; inputs stay plain copies into fixed buffers.
            gpu.stream
                .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
                .map_err(driver_err)?;
            let launched = launch_all(&gpu, g, &self.states, error_ptr, None);
            let captured = gpu.stream.end_capture(CUgraphInstantiate_flags(0)).map_err(driver_err);
            match (launched, captured) {
                (Ok(()), Ok(exec)) => g.exec = exec.map(Captured),
                // Nothing captured ran: this run goes eagerly (where a launch error of its own
                // shows again) and the next one captures anew.
                (launched, captured) => {
                    g.capture_failures += 1;
                    if g.capture_failures == CAPTURE_TRIES {
                        let why = launched.err().or(captured.err()).map(|e| e.to_string());
                        eprintln!(
                            "mlxcel: capturing a CUDA graph failed {CAPTURE_TRIES} times ({}); this graph runs eagerly",
                            why.unwrap_or_default()
                        );
                    }
                }
            }
        }
        match &g.exec {
            Some(exec) => exec.0.launch().map_err(driver_err)?,
            None => launch_all(
                &gpu,
                g,
                &self.states,
                error_ptr,
                self.profile.as_mut().map(|p| (p, id.0)),
            )?,
        }
        g.runs += 1;
        gpu.stream.synchronize().map_err(driver_err)?;
        let flag = gpu.stream.clone_dtoh(&self.error).map_err(driver_err)?[0];
        if flag != 0 {
            gpu.stream.memcpy_htod(&[0i32], &mut self.error).map_err(driver_err)?;
            let node = &g.graph.nodes[flag as usize - 1];
            return Err(Error::Runtime(format!(
                "{} (node {}): an index, position or length was out of range",
                node.op.name(),
                flag - 1
            )));
        }
        let g = self.graphs[id.0].as_ref().expect("ran above");
        let ptr_of = |i: usize| loc_ptr(&self.gpu, g.plan.locs[i], g, &self.states);
        g.graph
            .outputs
            .iter()
            .map(|o| self.download(&ptr_of, g, o.index()))
            .collect()
    }

    fn named_values(&self, id: GraphId) -> Result<Vec<(NodeName, HostTensor)>> {
        let g = self
            .graphs
            .get(id.0)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::Invalid(format!("no graph {} in this session", id.0)))?;
        if !g.keep_named {
            return Err(Error::Invalid("graph was loaded without keep_named".into()));
        }
        let ptr_of = |i: usize| loc_ptr(&self.gpu, g.plan.locs[i], g, &self.states);
        g.graph
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| {
                n.name
                    .clone()
                    .map(|name| self.download(&ptr_of, g, i).map(|t| (name, t)))
            })
            .collect()
    }

    fn read_state(&self, name: &str) -> Result<HostTensor> {
        let s = self.states.get(self.states.index(name)?);
        let host = self.gpu.stream.clone_dtoh(&s.buf).map_err(driver_err)?;
        let n = s.shape.iter().product::<usize>() * s.dtype.size();
        HostTensor::from_bytes(s.dtype, s.shape.clone(), Storage::from_vec(host[..n].to_vec()))
    }

    fn write_state(&mut self, name: &str, value: &HostTensor) -> Result<()> {
        let s = self.states.for_write(name, value)?;
        if !value.bytes().is_empty() {
            let mut view = s.buf.slice_mut(0..value.bytes().len());
            self.gpu
                .stream
                .memcpy_htod(value.bytes(), &mut view)
                .map_err(driver_err)?;
        }
        Ok(())
    }

    fn memory(&self) -> MemoryReport {
        MemoryReport {
            planned_bytes: self
                .graphs
                .iter()
                .flatten()
                .flat_map(|g| g.slots.iter().chain(&g.scratch_bufs).map(|s| s.len()))
                .sum(),
            state_bytes: self.states.iter().map(|s| s.buf.len()).sum(),
            parameter_bytes: self.uploads.iter().map(|(_, b)| b.len()).sum(),
        }
    }

    fn unload(&mut self, id: GraphId) -> Result<()> {
        if !matches!(self.graphs.get(id.0), Some(Some(_))) {
            return Err(Error::Invalid(format!("no graph {} in this session", id.0)));
        }
        // Nothing queued may still use its buffers or its captured graph.
        self.gpu.stream.synchronize().map_err(driver_err)?;
        self.graphs[id.0] = None;
        Ok(())
    }
}

impl Gpu {
    fn ptr_i32(&self, s: &CudaSlice<i32>) -> u64 {
        s.device_ptr(&self.stream).0
    }

    /// Launches `name` on `grid × block` threads with `smem` bytes of dynamic shared memory.
    fn launch(&self, name: &'static str, grid: u32, block: u32, smem: u32, args: &[Arg]) -> Result<()> {
        self.launch_grid(name, (grid, 1), block, smem, args)
    }

    /// A GEMV launch; a tensor-core one whose blocks loop over row tiles (staging x once) gets
    /// no more blocks than the device holds at once, and no more than it takes for each to do
    /// the same number of tiles (the most any block does anyway), so none idles while others
    /// do a last tile, and fewer blocks contend for the same bandwidth (H100, session 26,
    /// llama-3.1-8b: 367 → 374 tok/s, with every product programmatic 375 → 388).
    /// `MLXCEL_TC_PERSIST=1`: as many blocks as are held at once; `=0`: a block a tile.
    fn launch_gemv(&self, l: &launch::GemvLaunch, args: &[Arg]) -> Result<()> {
        static PERSIST: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        let persist = *PERSIST.get_or_init(|| launch::env_usize("MLXCEL_TC_PERSIST").unwrap_or(2));
        let mut grid = l.grid;
        let mut name = l.name;
        let tensor_cores = name.starts_with("tc_qgemv") || name.starts_with("tc_qglu");
        if persist != 0 && tensor_cores {
            let resident = |name: &'static str| self.resident_blocks(name, l.block, l.smem);
            let mut held = resident(name)?;
            if let Some(double) = double_buffered(name) {
                let rounds = |held: u32| grid.div_ceil(held);
                let held_db = resident(double)?;
                if double_buffered_on().unwrap_or(rounds(held_db) <= rounds(held)) {
                    (name, held) = (double, held_db);
                }
            }
            if persist == 2 && grid > held {
                grid = grid.div_ceil(grid.div_ceil(held));
            }
            grid = grid.min(held).min(launch::tc_block_cap().unwrap_or(u32::MAX));
        }
        let small = name.starts_with("qgemv_") && small_programmatic(l.weights);
        if (tensor_cores && programmatic(l.weights)) || small {
            return self.launch_programmatic(name, grid, l.block, l.smem, args);
        }
        self.launch(name, grid, l.block, l.smem, args)
    }

    /// How many blocks of `block` threads and `smem` bytes of dynamic shared memory of kernel
    /// `name` the device holds at once (at least 1).
    pub(crate) fn resident_blocks(&self, name: &'static str, block: u32, smem: u32) -> Result<u32> {
        let f = self.func(name)?;
        // The occupancy of a block past 48 KiB counts only once the kernel is allowed it.
        allow_shared(&f, name, smem)?;
        let per_sm = f
            .occupancy_max_active_blocks_per_multiprocessor(block, smem as usize, None)
            .map_err(driver_err)?;
        Ok((per_sm * self.sms).max(1))
    }

    /// Whether the device launches thread-block clusters ([`Gpu::launch_gemv_clusters`]).
    pub(crate) fn clusters(&self) -> bool {
        self.clusters
    }

    /// Whether the device runs clusters of `cluster` blocks of kernel `name` (`block` threads and
    /// `smem` bytes of dynamic shared memory each): past 8 blocks, Hopper's portable size, only
    /// as its graphics processing clusters and the kernel's resources allow.
    pub(crate) fn clusters_fit(&self, name: &'static str, cluster: u32, block: u32, smem: u32) -> Result<bool> {
        use cudarc::driver::sys;
        if !self.clusters || cluster == 0 {
            return Ok(false);
        }
        let f = self.func(name)?;
        allow_shared(&f, name, smem)?;
        allow_cluster(&f, name, cluster)?;
        let mut attrs = [cluster_attr(cluster)];
        let cfg = self.launch_config((cluster, 1), block, smem, &mut attrs);
        let mut clusters: std::ffi::c_int = 0;
        self.stream.context().bind_to_thread().map_err(driver_err)?;
        // SAFETY: cfg and attr outlive the call; the function is this context's.
        let r = unsafe { sys::cuOccupancyMaxActiveClusters(&mut clusters, f.cu_function(), &cfg) };
        Ok(r.result().is_ok() && clusters > 0)
    }

    /// A tensor-core GEMV launch of a block a tile (`l.grid`) in thread-block clusters of
    /// `cluster` blocks (nn.cu `tc_qgemv3_nrope`), programmatic as [`Gpu::launch_gemv`] decides.
    pub(crate) fn launch_gemv_clusters(&self, l: &launch::GemvLaunch, cluster: u32, args: &[Arg]) -> Result<()> {
        if !self.clusters || cluster == 0 || !l.grid.is_multiple_of(cluster) {
            return Err(Error::Backend(format!(
                "{}: {} blocks in clusters of {cluster} on this device",
                l.name, l.grid
            )));
        }
        self.launch_ex(
            l.name,
            (l.grid, 1),
            l.block,
            l.smem,
            args,
            programmatic(l.weights),
            cluster,
        )
    }

    /// [`Gpu::launch`] with programmatic dependent launch: the kernel may start while the one
    /// before it in the stream (or the captured graph) drains, so it must wait for that one
    /// (gemv.cu's tensor-core GEMVs: `pdl_wait` after requesting their first weights) before it
    /// reads what earlier kernels wrote or writes anything. Scalar and pointer arguments only.
    fn launch_programmatic(&self, name: &'static str, grid: u32, block: u32, smem: u32, args: &[Arg]) -> Result<()> {
        self.launch_ex(name, (grid, 1), block, smem, args, true, 1)
    }

    /// A launch through cuLaunchKernelEx: programmatic (see [`Gpu::launch_programmatic`]) or
    /// not, in clusters of `cluster` blocks where that is above 1. Scalar and pointer arguments
    /// only.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch_ex(
        &self,
        name: &'static str,
        grid: (u32, u32),
        block: u32,
        smem: u32,
        args: &[Arg],
        programmatic: bool,
        cluster: u32,
    ) -> Result<()> {
        use cudarc::driver::sys;
        let f = self.func(name)?;
        allow_shared(&f, name, smem)?;
        allow_cluster(&f, name, cluster)?;
        // The kernel's parameters: the address of each argument's value, which outlives the call.
        let mut params = args
            .iter()
            .map(|a| match a {
                Arg::Ptr(v) | Arg::U64(v) => Ok(v as *const u64 as *mut std::ffi::c_void),
                Arg::I64(v) => Ok(v as *const i64 as *mut std::ffi::c_void),
                Arg::I32(v) => Ok(v as *const i32 as *mut std::ffi::c_void),
                Arg::F32(v) => Ok(v as *const f32 as *mut std::ffi::c_void),
                Arg::View(_) => Err(Error::Backend(format!(
                    "{name}: a by-value struct in a programmatic launch"
                ))),
            })
            .collect::<Result<Vec<_>>>()?;
        // SAFETY: a zeroed attribute is valid plain data; ids and values are set below.
        let mut attrs: Vec<sys::CUlaunchAttribute> = Vec::new();
        if programmatic {
            let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            attrs.push(attr);
        }
        if cluster > 1 {
            attrs.push(cluster_attr(cluster));
        }
        let cfg = self.launch_config(grid, block, smem, &mut attrs);
        self.stream.context().bind_to_thread().map_err(driver_err)?;
        // SAFETY: as in launch_grid: the parameter list matches the kernel's (launch.rs), every
        // pointer names a live buffer; params, attrs and cfg outlive the call.
        unsafe { sys::cuLaunchKernelEx(&cfg, f.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()) }
            .result()
            .map_err(|e| Error::Backend(format!("launching {name}: {e:?}")))
    }

    /// cuLaunchKernelEx's configuration of a launch on this stream, with `attrs` (which must
    /// outlive its use).
    fn launch_config(
        &self,
        grid: (u32, u32),
        block: u32,
        smem: u32,
        attrs: &mut [cudarc::driver::sys::CUlaunchAttribute],
    ) -> cudarc::driver::sys::CUlaunchConfig {
        cudarc::driver::sys::CUlaunchConfig {
            gridDimX: grid.0.max(1),
            gridDimY: grid.1.max(1),
            gridDimZ: 1,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: smem,
            hStream: self.stream.cu_stream(),
            attrs: attrs.as_mut_ptr(),
            numAttrs: attrs.len() as u32,
        }
    }

    /// [`Gpu::launch`] on a two-dimensional grid.
    fn launch_grid(&self, name: &'static str, grid: (u32, u32), block: u32, smem: u32, args: &[Arg]) -> Result<()> {
        let f = self.func(name)?;
        allow_shared(&f, name, smem)?;
        let mut b = self.stream.launch_builder(&f);
        for a in args {
            match a {
                Arg::Ptr(v) | Arg::U64(v) => b.arg(v),
                Arg::I64(v) => b.arg(v),
                Arg::I32(v) => b.arg(v),
                Arg::F32(v) => b.arg(v),
                Arg::View(v) => b.arg(&**v),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: (grid.0.max(1), grid.1.max(1), 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: smem,
        };
        // SAFETY: every kernel's parameter list matches what its launch site pushes (see launch.rs),
        // and every pointer names a live buffer of the session sized by the planner.
        unsafe { b.launch(cfg) }.map_err(|e| Error::Backend(format!("launching {name}: {e:?}")))?;
        Ok(())
    }
}

/// Allows kernel `f` (`name`) `smem` bytes of dynamic shared memory: past 48 KiB with its
/// static shared memory (qmm_ring_glu's 48 KiB of ring and x, plus its pointer table), a kernel
/// must be given its limit before it launches, or before its occupancy is asked for that size.
fn allow_shared(f: &CudaFunction, name: &str, smem: u32) -> Result<()> {
    // Only a large dynamic size can pass the limit with a kernel's few KiB of static memory.
    let fixed = if smem > 16 << 10 {
        f.shared_size_bytes()
            .map_err(|e| Error::Backend(format!("{name}: its static shared memory: {e:?}")))?
    } else {
        0
    };
    if smem as u64 + fixed.max(0) as u64 > 48 << 10 {
        f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .map_err(|e| Error::Backend(format!("{name}: {smem} bytes of shared memory: {e:?}")))?;
    }
    Ok(())
}

/// The launch attribute of clusters of `cluster` blocks along x.
fn cluster_attr(cluster: u32) -> cudarc::driver::sys::CUlaunchAttribute {
    use cudarc::driver::sys;
    // SAFETY: a zeroed attribute is valid plain data; id and value are set below.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = cluster;
    attr.value.clusterDim.y = 1;
    attr.value.clusterDim.z = 1;
    attr
}

/// Allows kernel `f` (`name`) clusters of `cluster` blocks: past Hopper's portable 8, only once
/// the kernel is marked for it.
fn allow_cluster(f: &CudaFunction, name: &str, cluster: u32) -> Result<()> {
    if cluster > 8 {
        f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
            1,
        )
        .map_err(|e| Error::Backend(format!("{name}: clusters of {cluster} blocks: {e:?}")))?;
    }
    Ok(())
}

/// Whether a tensor-core GEMV reading `weights` bytes of one matrix is launched with
/// programmatic dependent launch (it starts while the kernel ahead drains and requests its first
/// weights): by default every one. Once, only matrices up to 16 MiB were (llama-3.1-8b 275.8 →
/// 271.5 tok/s with all, its large products competing with the kernel ahead for bandwidth);
/// with today's kernels all of them gain (H100, session 26: llama-3.1-8b 367 → 375, with
/// [`Gpu::launch_gemv`]'s even split of tiles 388; qwen3-8b 339 → 361, 363 with the split).
/// `MLXCEL_PDL=small`: the 16 MiB rule; `MLXCEL_PDL=0`: none.
fn programmatic(weights: usize) -> bool {
    static MODE: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    let mode = MODE.get_or_init(|| match std::env::var("MLXCEL_PDL").as_deref() {
        Ok("small") => None,
        Ok(v) => Some(v != "0"),
        Err(_) => Some(true),
    });
    mode.unwrap_or(weights <= 16 << 20)
}

/// Whether a quantized CUDA-core GEMV (gemv.cu `qgemv`, which waits for the kernel ahead after
/// requesting its first weights) reading `weights` bytes is launched programmatically: where
/// the matrix is at most 1 MiB, the MoE router's product after its add + RMSNorm (which lets it
/// start at once), so its weights are on their way while the norm runs. `MLXCEL_PDL_SMALL=0`:
/// plain launches.
fn small_programmatic(weights: usize) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    launch::switch(&ON, "MLXCEL_PDL_SMALL", true) && weights > 0 && weights <= 1 << 20
}

/// One kernel argument, by the C type of the kernel's parameter.
#[derive(Clone)]
pub(crate) enum Arg {
    /// A device pointer (`const T*` / `T*`).
    Ptr(u64),
    U64(u64),
    I64(i64),
    I32(i32),
    F32(f32),
    View(Box<launch::View8>),
}

pub mod bandwidth;
mod fuse;
mod launch;
mod profile;

impl Drop for CudaSession {
    fn drop(&mut self) {
        let mut map = self.gpu.packed.lock().expect("packed weights lock");
        for (key, _) in &self.packed {
            map.remove(key);
        }
        drop(map);
        if let Some(p) = &self.profile {
            eprint!("{}", p.report());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ptx_cache_name_changes_with_arch_driver_and_source() {
        let name = cache_name("sm_90", 13000);
        assert_ne!(name, cache_name("sm_80", 13000), "arch");
        assert_ne!(name, cache_name("sm_90", 13010), "driver");
        assert_eq!(name, cache_name("sm_90", 13000), "stable");
        // The source's hash is the name's last part: one changed byte changes it.
        let hash = format!("{:016x}", fnv1a(crate::kernel_source().as_bytes()));
        assert!(name.ends_with(&format!("-{hash}.ptx")), "{name}");
        let mut other = crate::kernel_source().into_bytes();
        other[0] ^= 1;
        assert_ne!(fnv1a(&other), fnv1a(crate::kernel_source().as_bytes()));
    }
}
