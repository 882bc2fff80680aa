//! From a node to its kernel launch: argument lists mirror the kernels' parameters in
//! `kernels/*.cu`, one `match` arm per op.

use cudarc::driver::DeviceRepr;
use mlxcel_core::{BinaryOp, CompareOp, Error, Graph, Op, ReduceOp, Result, UnaryOp};

use super::{acode, fcode, fsuffix, icode, Arg, Gpu};

/// Strided-copy description passed by value (`View8` in layout.cu).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct View8 {
    rank: i32,
    shape: [i64; 8],
    src_stride: [i64; 8],
    dst_stride: [i64; 8],
    src_off: i64,
    dst_off: i64,
}

// SAFETY: plain-old-data with the same C layout as the kernel's struct.
unsafe impl DeviceRepr for View8 {}

const THREADS: u32 = 256;

/// Blocks for a grid-stride loop over `n` elements.
fn blocks(n: usize) -> u32 {
    n.div_ceil(THREADS as usize).clamp(1, 1 << 16) as u32
}

fn strides(shape: &[usize]) -> Vec<i64> {
    let mut s = vec![1i64; shape.len()];
    for a in (0..shape.len().saturating_sub(1)).rev() {
        s[a] = s[a + 1] * shape[a + 1] as i64;
    }
    s
}

fn view(shape: &[usize], src_stride: &[i64], src_off: i64, dst_stride: &[i64], dst_off: i64) -> Result<View8> {
    if shape.len() > 8 {
        return Err(Error::Unsupported {
            backend: "cuda",
            op: format!("layout op of rank {}", shape.len()),
        });
    }
    let mut v = View8 {
        rank: shape.len() as i32,
        shape: [1; 8],
        src_stride: [0; 8],
        dst_stride: [0; 8],
        src_off,
        dst_off,
    };
    for a in 0..shape.len() {
        v.shape[a] = shape[a] as i64;
        v.src_stride[a] = src_stride[a];
        v.dst_stride[a] = dst_stride[a];
    }
    Ok(v)
}

fn dims(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (
        shape[..axis].iter().product(),
        shape[axis],
        shape[axis + 1..].iter().product(),
    )
}

fn unary_code(u: UnaryOp) -> (i32, f32) {
    match u {
        UnaryOp::Neg => (0, 0.0),
        UnaryOp::Abs => (1, 0.0),
        UnaryOp::Exp => (2, 0.0),
        UnaryOp::Log => (3, 0.0),
        UnaryOp::Sqrt => (4, 0.0),
        UnaryOp::Rsqrt => (5, 0.0),
        UnaryOp::Tanh => (6, 0.0),
        UnaryOp::Sigmoid => (7, 0.0),
        UnaryOp::Silu => (8, 0.0),
        UnaryOp::GeluErf => (9, 0.0),
        UnaryOp::GeluTanh => (10, 0.0),
        UnaryOp::Softcap(c) => (11, c),
        UnaryOp::Sin => (12, 0.0),
        UnaryOp::Cos => (13, 0.0),
    }
}

/// The unary code of a GLU's activation node.
fn act_code(op: &Op) -> i32 {
    match op {
        Op::Unary(u) => unary_code(*u).0,
        _ => unreachable!("a GLU's activation is a unary op"),
    }
}

fn binary_code(b: BinaryOp) -> i32 {
    match b {
        BinaryOp::Add => 0,
        BinaryOp::Sub => 1,
        BinaryOp::Mul => 2,
        BinaryOp::Div => 3,
        BinaryOp::Maximum => 4,
        BinaryOp::Minimum => 5,
    }
}

fn compare_code(c: CompareOp) -> i32 {
    match c {
        CompareOp::Eq => 0,
        CompareOp::Ne => 1,
        CompareOp::Lt => 2,
        CompareOp::Le => 3,
        CompareOp::Gt => 4,
        CompareOp::Ge => 5,
    }
}

/// Rows of x the GEMV kernels (gemv.cu) take; more go to the general kernels.
pub(crate) const GEMV_ROWS: usize = 8;

/// (token, expert) pairs up to which a routed-expert product takes the gathered GEMV kernel
/// (a block row per pair); more (prefill) go to the general kernel.
pub(crate) const GATHER_GEMV_PAIRS: usize = 64;

/// How a gemv.cu kernel is launched.
pub(crate) struct GemvLaunch {
    pub name: &'static str,
    pub grid: u32,
    pub block: u32,
    /// Dynamic shared memory: one row of x as f32 plus its 16-value sums when the kernel
    /// stages it there (at most MAX_STAGED_BYTES), else 0.
    pub smem: u32,
    /// Bytes of packed weights one matrix of the launch reads (tensor-core launches and
    /// quantized CUDA-core products; 0 for the others): what decides programmatic launch
    /// (`Gpu::launch_gemv`).
    pub weights: usize,
}

/// The gemv.cu instantiation `{family}_{x}_{variant}_{MR}_{R}` for `rows` rows of x (`k` wide)
/// and `n` outputs, and its launch: R weight rows a warp (wide matrices share each load of x
/// between more rows; narrow ones keep one row a warp so every SM has work); for one row of x,
/// optionally eight warps a block reading x from shared memory.
pub(crate) fn gemv_kernel(
    family: &str,
    x: mlxcel_core::DType,
    variant: &str,
    rows: usize,
    n: usize,
    k: usize,
) -> Result<GemvLaunch> {
    let (mr, r) = match (rows, n, forced_rows_per_warp()) {
        (2.., _, _) => (GEMV_ROWS, 1),
        (_, _, Some(r)) => (1, r),
        (_, 8192.., _) => (1, 4),
        (_, 2048.., _) => (1, 2),
        _ => (1, 1),
    };
    let name = intern(format!("{family}_{}_{variant}_{mr}_{r}", fsuffix(x)?));
    // Staged: x as f32 and the sum of each 16 of its values (gemv.cu, stage_xf).
    let staged_bytes = (k + k / 16) * 4;
    let tune = gemv_tuning();
    let (warps, smem) = if rows == 1 && tune.smem && k.is_multiple_of(16) && staged_bytes <= MAX_STAGED_BYTES {
        (tune.warps, staged_bytes.next_multiple_of(16) as u32)
    } else {
        (4, 0)
    };
    Ok(GemvLaunch {
        name,
        grid: n.div_ceil(warps * r) as u32,
        block: 32 * warps as u32,
        smem,
        weights: 0,
    })
}

/// The tensor-core GEMV (gemv.cu, `tc_{family}_{x}_4`) for one row of f16 or bf16 x by 4-bit
/// weights, when it applies: k a multiple of 64 (a quarter of its 256-value chunk; SmolLM2's 576
/// and 1536 take it, with the add + RMSNorm folded in), x staged whole in
/// shared memory. A block computes 16 weight rows, its warps splitting k: as many warps (a power
/// of two up to 16, at least 2, at most the chunks) as keep about 32 warps on each SM.
/// `MLXCEL_GEMV_TC=0` turns it off and `MLXCEL_TC_WARPS=N` fixes the warps (for kernel tuning).
pub(crate) fn tc_gemv_kernel(
    family: &str,
    x: mlxcel_core::DType,
    bits: u32,
    rows: usize,
    n: usize,
    k: usize,
) -> Option<GemvLaunch> {
    use mlxcel_core::DType;
    let tune = gemv_tuning();
    if !tune.tensor_cores || rows != 1 || bits != 4 || !matches!(x, DType::F16 | DType::BF16) || !k.is_multiple_of(64) {
        return None;
    }
    // The kernel indexes a weight's packed words in 32 bits.
    if (n * k / 8) >> 32 != 0 {
        return None;
    }
    // x staged, its run sums and its offsets' sums (gemv.cu, tc_stage_x).
    let smem = 2 * k + k / 4;
    if smem > MAX_STAGED_BYTES {
        return None;
    }
    let chunks = k.div_ceil(256);
    let tiles = n.div_ceil(16);
    let warps = tune.tc_warps.unwrap_or_else(|| {
        let want = (132 * 32usize).div_ceil(tiles).clamp(2, 16).min(chunks);
        (0..=4).rev().map(|p| 1usize << p).find(|&w| w <= want).unwrap_or(1)
    });
    Some(GemvLaunch {
        name: intern(format!(
            "tc_{family}_{}_4{}",
            if x == DType::F16 { "f16" } else { "bf16" },
            match family {
                // Bounded at 64 registers where blocks are large (two 512-thread blocks an SM
                // rather than one); smaller blocks measured 1-3% faster unbounded (gemma3-1b,
                // qwen3-30b-a3b's attention products).
                "qgemv" => tune.tc_gemv_regs.unwrap_or(if warps >= 8 { "" } else { "_r0" }),
                _ => "",
            }
        )),
        grid: tiles as u32,
        block: 32 * warps.clamp(1, 16) as u32,
        smem: smem.next_multiple_of(16) as u32,
        weights: n * k / 2,
    })
}

/// The block of a routed product's (or GLU's) tensor-core launch of `grid` blocks of kernel
/// `name`, a block a 16-row tile of one (token, expert) pair with no loop over tiles: `block` as
/// [`tc_gemv_kernel`] chose it (about 32 warps an SM), or [`one_round_warps`]' smaller one, with
/// the device's occupancy. `var` (`MLXCEL_GATHER_WARPS` for the product,
/// `MLXCEL_GATHER_GLU_WARPS` for the GLU) fixes the warps, for tuning.
fn gather_block(
    gpu: &Gpu,
    name: &'static str,
    grid: (u32, u32),
    block: u32,
    smem: u32,
    k: usize,
    var: &str,
) -> Result<u32> {
    if let Some(w) = env_usize(var) {
        return Ok(32 * w.clamp(1, 16) as u32);
    }
    let chunks = k.div_ceil(256) as u32;
    let warps = one_round_warps(block / 32, chunks, grid.0 * grid.1, |w| {
        gpu.resident_blocks(name, 32 * w, smem)
    })?;
    Ok(32 * warps)
}

/// The warps a block for a launch of `blocks` blocks that each run once (no loop over tiles),
/// from `warps`: half as many where the blocks take more than one round of what the device holds
/// at once (`resident(w)` blocks of w warps) and half as many do fit in one round, each warp then
/// taking at most two of the `chunks`; else `warps`. The routed GLU's 96 registers a thread hold
/// two 8-warp blocks an SM, so qwen3-30b-a3b's 384 blocks (48 tiles of 768 rows, 8 experts)
/// took 1.45 rounds; with 4 warps forced (one round, two chunks a warp, what this rule picks
/// there) 328.6 against 315.7 tok/s on the H100 (docs/benchmark_results/cuda-decode.md, session
/// 21; the rule itself, session 22: 328.4 against 316.2 with 8 warps).
pub(crate) fn one_round_warps(
    warps: u32,
    chunks: u32,
    blocks: u32,
    resident: impl Fn(u32) -> Result<u32>,
) -> Result<u32> {
    if warps <= 2 || blocks <= resident(warps)? {
        return Ok(warps);
    }
    let half = warps / 2;
    Ok(if chunks.div_ceil(half) <= 2 && blocks <= resident(half)? {
        half
    } else {
        warps
    })
}

/// The ring variant (gemv.cu `tc_qring`) of a tensor-core GEMV launch `l` for `nm` weights a
/// tile (2: a GLU) where it applies, else `l`: each warp streams its chunks of weights, scales
/// and biases through shared-memory stages (cp.async) instead of one chunk in its registers.
/// With the launch comes the ring kernel's last argument, its stage count. Needs k a multiple of
/// 128 and each row's scales to
/// start on 4 bytes. Off by default: `MLXCEL_TC_RING=N` turns it on with N stages (4 measured
/// best; with `MLXCEL_PDL=1` it led on the 8B presets and trailed on the 1B ones,
/// docs/benchmark_results/cuda-decode.md), `MLXCEL_RING_WARPS=N` sets the warps a block (default:
/// the tensor-core GEMV's choice, at most 8), `MLXCEL_RING_MIN=M` the fewest weights (in 2^20
/// values, all `nm` matrices) that take it (default 24).
pub(crate) fn tc_ring(
    l: GemvLaunch,
    nm: usize,
    k: usize,
    group: usize,
    scales: mlxcel_core::DType,
) -> (GemvLaunch, Option<i32>) {
    static RING: std::sync::OnceLock<(usize, Option<usize>, usize)> = std::sync::OnceLock::new();
    let (ring, warps, least) = *RING.get_or_init(|| {
        (
            env_usize("MLXCEL_TC_RING").unwrap_or(0).min(8),
            env_usize("MLXCEL_RING_WARPS").filter(|w| (1..=16).contains(w)),
            env_usize("MLXCEL_RING_MIN").unwrap_or(24) << 20,
        )
    });
    let ssz = scales.size();
    let tiles = l.grid as usize;
    if ring < 2
        || !k.is_multiple_of(128)
        || tiles * 16 * k * nm < least
        || !matches!(group, 32 | 64 | 128)
        || !(k / group * ssz).is_multiple_of(4)
    {
        return (l, None);
    }
    let chunks = k.div_ceil(256);
    let warps = warps.unwrap_or((l.block as usize / 32).min(8)).min(chunks);
    // A warp's items: its chunks of a tile, times the tiles of a block where blocks loop.
    let items = chunks.div_ceil(warps) * if tiles > 2 * 132 { 8 } else { 1 };
    let x = (2 * k + k / 4).next_multiple_of(16);
    let stage = nm * (2048 + 32 * (256 / group) * ssz);
    let mut ring = ring.min(items);
    while ring >= 2 && x + warps * ring * stage > MAX_RING_BYTES {
        ring -= 1;
    }
    if ring < 2 {
        return (l, None);
    }
    let name = l.name.trim_end_matches("_r0");
    let ringed = GemvLaunch {
        name: intern(format!("{name}_ring")),
        grid: l.grid,
        block: 32 * warps as u32,
        smem: (x + warps * ring * stage) as u32,
        weights: l.weights,
    };
    (ringed, Some(ring as i32))
}

/// The group argument of a (not ring) tensor-core GEMV launch with gemv.cu's flags, and its
/// weights: each weight's (words, scales, biases) addresses in `mats` become their tile-packed
/// copies (`MLXCEL_TC_PACK=1`, flag Q4_PACKED) where every weight of the launch has them.
fn tc_group(gpu: &Gpu, mats: &mut [[u64; 3]], group: usize) -> i32 {
    const Q4_PACKED: i32 = 1 << 16;
    let mut code = group as i32;
    let packed: Option<Vec<[u64; 3]>> = mats.iter().map(|m| gpu.packed(m[0], m[1], m[2])).collect();
    if let Some(p) = packed {
        mats.copy_from_slice(&p);
        code |= Q4_PACKED;
    }
    code
}

/// Most dynamic shared memory a ring GEMV block asks for (of the 227 KiB Hopper allows).
const MAX_RING_BYTES: usize = 200 << 10;

/// A switch read once into `cell`: `var=0` turns off a path that is on by default, `var=1` turns
/// on one that is off by default.
pub(crate) fn switch(cell: &'static std::sync::OnceLock<bool>, var: &str, on_by_default: bool) -> bool {
    *cell.get_or_init(|| match std::env::var(var) {
        Ok(v) if on_by_default => v != "0",
        Ok(v) => v == "1",
        Err(_) => on_by_default,
    })
}

/// The tuning variable `var` as a number, if set and one.
pub(crate) fn env_usize(var: &str) -> Option<usize> {
    std::env::var(var).ok().and_then(|v| v.parse().ok())
}

/// The gemv.cu variant name of a bit width (4 or 8).
fn bits_name(bits: u32) -> &'static str {
    if bits == 4 {
        "4"
    } else {
        "8"
    }
}

/// Most shared memory a staged GEMV asks for (Hopper gives a block up to 227 KiB; past 48 KiB
/// the launch raises the kernel's limit first).
const MAX_STAGED_BYTES: usize = 160 << 10;

struct GemvTuning {
    smem: bool,
    warps: usize,
    tensor_cores: bool,
    tc_warps: Option<usize>,
    /// Kernel-name suffix of the tensor-core GEMV's register bound, where forced: "" (at most
    /// 64, `MLXCEL_TC_GEMV_REGS=64`) or "_r0" (what ptxas takes, `MLXCEL_TC_GEMV_REGS=0`);
    /// by block size otherwise.
    tc_gemv_regs: Option<&'static str>,
}

/// `MLXCEL_GEMV_SMEM=1` (x staged in shared memory as f32 with its 16-value sums, made once per
/// block; off by default until measured: staging x in its own dtype measured 5–15% slower than
/// reading it through L1, docs/benchmark_results/cuda-decode.md) and
/// `MLXCEL_GEMV_WARPS=4|8|16` (warps a block when x is staged): for kernel tuning; read once.
fn gemv_tuning() -> &'static GemvTuning {
    static T: std::sync::OnceLock<GemvTuning> = std::sync::OnceLock::new();
    T.get_or_init(|| GemvTuning {
        smem: std::env::var("MLXCEL_GEMV_SMEM").is_ok_and(|v| v == "1"),
        warps: env_usize("MLXCEL_GEMV_WARPS")
            .filter(|w| matches!(w, 4 | 8 | 16))
            .unwrap_or(8),
        tensor_cores: std::env::var("MLXCEL_GEMV_TC").map_or(true, |v| v != "0"),
        tc_warps: env_usize("MLXCEL_TC_WARPS").filter(|w| (1..=16).contains(w)),
        tc_gemv_regs: match env_usize("MLXCEL_TC_GEMV_REGS") {
            Some(0) => Some("_r0"),
            Some(64) => Some(""),
            _ => None,
        },
    })
}

/// `MLXCEL_GEMV_R=1|2|4`: weight rows per warp for every one-row GEMV, in place of the choice
/// by width (for kernel tuning; read once).
fn forced_rows_per_warp() -> Option<usize> {
    static R: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *R.get_or_init(|| env_usize("MLXCEL_GEMV_R").filter(|r| matches!(r, 1 | 2 | 4)))
}

/// Kernel names live as long as the process (the kernel table is keyed by `&'static str`).
fn intern(name: String) -> &'static str {
    use std::collections::HashSet;
    use std::sync::Mutex;
    static NAMES: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let mut names = NAMES.lock().expect("kernel name table");
    let set = names.get_or_insert_with(HashSet::new);
    if let Some(n) = set.get(name.as_str()) {
        return n;
    }
    let n: &'static str = Box::leak(name.into_boxed_str());
    set.insert(n);
    n
}

/// Launches node `i`. `ptr(k)` is the device pointer of its k-th input, `out` of its value.
/// `heads_last`: an attention (by the flash prefill kernel, [`Fused::HeadsLastAttention`])
/// writes its output as [B, T, Hq, D] instead of [B, Hq, T, D]; false for every other launch.
///
/// `rope`: a decode attention's rope parameters ([`Fused::RopeAttention`]; its split kernel's
/// `_rope` variant takes them after its own, and `ptr(0)` is then the queries before rope);
/// None for every other launch.
///
/// [`Fused::HeadsLastAttention`]: super::fuse::Fused::HeadsLastAttention
/// [`Fused::RopeAttention`]: super::fuse::Fused::RopeAttention
#[allow(clippy::too_many_arguments)]
pub fn node(
    gpu: &Gpu,
    graph: &Graph,
    i: usize,
    ptr: &dyn Fn(usize) -> u64,
    out: u64,
    scratch: u64,
    error: u64,
    tag: i32,
    heads_last: bool,
    rope: Option<&[Arg]>,
) -> Result<()> {
    use Arg::{Ptr, F32, I32, I64, U64};
    let node = &graph.nodes[i];
    let input = |k: usize| graph.node(node.inputs[k]);
    let n = node.shape.iter().product::<usize>();
    let ni = n as i64;
    if matches!(node.op, Op::MatMul { .. } | Op::QuantizedMatMul { .. }) && try_gemm(gpu, graph, i, ptr, out, scratch)?
    {
        return Ok(());
    }
    match &node.op {
        Op::Parameter { .. } | Op::Constant { .. } | Op::Input { .. } | Op::State { .. } | Op::Reshape => Ok(()),
        Op::Unary(u) => {
            let (op, p) = unary_code(*u);
            let name = if node.dtype.is_float() {
                match fsuffix(node.dtype)? {
                    "f32" => "unary_f32",
                    "f16" => "unary_f16",
                    _ => "unary_bf16",
                }
            } else {
                "unary_i32"
            };
            gpu.launch(
                name,
                blocks(n),
                THREADS,
                0,
                &[I32(op), F32(p), Ptr(ptr(0)), Ptr(out), I64(ni)],
            )
        }
        Op::Binary(b) => {
            let name = match node.dtype {
                mlxcel_core::DType::F32 => "binary_f32",
                mlxcel_core::DType::F16 => "binary_f16",
                mlxcel_core::DType::BF16 => "binary_bf16",
                mlxcel_core::DType::I32 => "binary_i32",
                _ => "binary_u32",
            };
            gpu.launch(
                name,
                blocks(n),
                THREADS,
                0,
                &[I32(binary_code(*b)), Ptr(ptr(0)), Ptr(ptr(1)), Ptr(out), I64(ni)],
            )
        }
        Op::Compare(c) => gpu.launch(
            "compare_any",
            blocks(n),
            THREADS,
            0,
            &[
                I32(compare_code(*c)),
                I32(acode(input(0).dtype)),
                Ptr(ptr(0)),
                Ptr(ptr(1)),
                Ptr(out),
                I64(ni),
            ],
        ),
        Op::Where => gpu.launch(
            "select_any",
            blocks(n),
            THREADS,
            0,
            &[
                Ptr(ptr(0)),
                Ptr(ptr(1)),
                Ptr(ptr(2)),
                Ptr(out),
                I32(node.dtype.size() as i32),
                I64(ni),
            ],
        ),
        Op::AsType => {
            let from = match input(0).dtype {
                mlxcel_core::DType::Bool => 5, // read as one byte
                d => acode(d),
            };
            gpu.launch(
                "astype_any",
                blocks(n),
                THREADS,
                0,
                &[I32(from), Ptr(ptr(0)), I32(acode(node.dtype)), Ptr(out), I64(ni)],
            )
        }
        Op::Reduce { op, axis, .. } => {
            let (outer, len, inner) = dims(&input(0).shape, *axis);
            let code = match op {
                ReduceOp::Sum => 0,
                ReduceOp::Max => 1,
                ReduceOp::Min => 2,
                ReduceOp::ArgMax => 3,
                ReduceOp::LogSumExp => 4,
            };
            let name = match fsuffix(input(0).dtype)? {
                "f32" => "reduce_f32",
                "f16" => "reduce_f16",
                _ => "reduce_bf16",
            };
            if let (Some((rows, parts)), true) = (argmax_parts(graph, i), scratch != 0) {
                // Long rows: slices over many blocks, then one warp a row (reduce.cu).
                let values = scratch;
                let indices = scratch + 4 * (rows * parts) as u64;
                let part_args = [Ptr(ptr(0)), Ptr(values), Ptr(indices), I64(len as i64)];
                let part_name = intern(format!("argmax_part_{}", fsuffix(input(0).dtype)?));
                gpu.launch_grid(part_name, (rows as u32, parts as u32), 256, 0, &part_args)?;
                let final_args = [Ptr(values), Ptr(indices), I64(parts as i64), I64(len as i64), Ptr(out)];
                return gpu.launch("argmax_final", rows as u32, 32, 0, &final_args);
            }
            let (y, yi) = if *op == ReduceOp::ArgMax { (0, out) } else { (out, 0) };
            let args = [
                I32(code),
                Ptr(ptr(0)),
                Ptr(y),
                Ptr(yi),
                I64(len as i64),
                I64(inner as i64),
            ];
            gpu.launch(name, (outer * inner) as u32, THREADS, 0, &args)
        }
        Op::Softmax { axis } => {
            let (outer, len, inner) = dims(&input(0).shape, *axis);
            let name = match fsuffix(node.dtype)? {
                "f32" => "softmax_f32",
                "f16" => "softmax_f16",
                _ => "softmax_bf16",
            };
            gpu.launch(
                name,
                (outer * inner) as u32,
                THREADS,
                0,
                &[Ptr(ptr(0)), Ptr(out), I64(len as i64), I64(inner as i64)],
            )
        }
        Op::CumSum { axis, reverse } => {
            let (outer, len, inner) = dims(&input(0).shape, *axis);
            let name = match fsuffix(node.dtype)? {
                "f32" => "cumsum_f32",
                "f16" => "cumsum_f16",
                _ => "cumsum_bf16",
            };
            let args = [
                Ptr(ptr(0)),
                Ptr(out),
                I64(outer as i64),
                I64(len as i64),
                I64(inner as i64),
                I32(i32::from(*reverse)),
            ];
            gpu.launch(name, blocks(outer * inner), THREADS, 0, &args)
        }
        Op::MatMul { transpose_b } => {
            let (sa, sb) = (&input(0).shape, &input(1).shape);
            let (m, k) = (sa[sa.len() - 2], sa[sa.len() - 1]);
            let nn = if *transpose_b {
                sb[sb.len() - 2]
            } else {
                sb[sb.len() - 1]
            };
            let batch: usize = sa[..sa.len() - 2].iter().product();
            let mut args = vec![
                Ptr(ptr(0)),
                I32(fcode(input(0).dtype)?),
                Ptr(ptr(1)),
                I32(fcode(input(1).dtype)?),
                Ptr(out),
                I32(fcode(node.dtype)?),
                I64(batch as i64),
                I64(m as i64),
                I64(nn as i64),
                I64(k as i64),
            ];
            let rows = batch * m;
            if *transpose_b && sb.len() == 2 && rows <= GEMV_ROWS && k % 8 == 0 && input(1).dtype.size() == 2 {
                let (xdt, wdt) = (input(0).dtype, input(1).dtype);
                if let Some(g) = dense_split(xdt, rows, nn, k) {
                    let name = intern(format!("dsk_gemv_{}_{}", fsuffix(xdt)?, fsuffix(wdt)?));
                    let args = [
                        Ptr(ptr(0)),
                        Ptr(ptr(1)),
                        Ptr(out),
                        I32(fcode(node.dtype)?),
                        I64(nn as i64),
                        I64(k as i64),
                        I32(g as i32),
                    ];
                    return gpu.launch(name, dsk_blocks(nn, g), DSK_THREADS, 0, &args);
                }
                let l = gemv_kernel("dgemv", input(0).dtype, fsuffix(input(1).dtype)?, rows, nn, k)?;
                let args = [
                    Ptr(ptr(0)),
                    I32(rows as i32),
                    Ptr(ptr(1)),
                    Ptr(out),
                    I32(fcode(node.dtype)?),
                    I64(nn as i64),
                    I64(k as i64),
                ];
                return gpu.launch(l.name, l.grid, l.block, l.smem, &args);
            }
            // Linear layers (b transposed) take the coalescing warp-per-output kernel, which has
            // no transpose parameter; the general kernel does.
            let (name, grid) = if *transpose_b {
                ("matmul_t_warp", blocks(n * 32))
            } else {
                args.push(I32(0));
                ("matmul", blocks(n))
            };
            args.push(I32(i32::from(sb.len() > 2)));
            gpu.launch(name, grid, THREADS, 0, &args)
        }
        Op::QuantizedMatMul { bits, group_size } => {
            if let Some(q) = qmm_rows_plan(graph, i) {
                return qmm_rows(gpu, graph, i, &q, ptr, out, scratch);
            }
            let k = *input(0).shape.last().unwrap();
            let nn = input(1).shape[0];
            let m = input(0).shape.iter().product::<usize>() / k;
            let args = [
                Ptr(ptr(0)),
                I32(fcode(input(0).dtype)?),
                Ptr(ptr(1)),
                Ptr(ptr(2)),
                Ptr(ptr(3)),
                I32(fcode(input(2).dtype)?),
                Ptr(out),
                I32(fcode(node.dtype)?),
                I64(m as i64),
                I64(nn as i64),
                I64(k as i64),
                I32(*bits as i32),
                I32(*group_size as i32),
            ];
            if m <= GEMV_ROWS && matches!(bits, 4 | 8) && group_size % 32 == 0 && k % group_size == 0 {
                let (l, stages) = match tc_gemv_kernel("qgemv", input(0).dtype, *bits, m, nn, k) {
                    Some(l) => tc_ring(l, 1, k, *group_size, input(2).dtype),
                    None => {
                        let l = gemv_kernel("qgemv", input(0).dtype, bits_name(*bits), m, nn, k)?;
                        let weights = nn * k * *bits as usize / 8;
                        (GemvLaunch { weights, ..l }, None)
                    }
                };
                let mut mats = [[ptr(1), ptr(2), ptr(3)]];
                let group = if l.name.starts_with("tc_") && stages.is_none() {
                    tc_group(gpu, &mut mats, *group_size)
                } else {
                    *group_size as i32
                };
                let [w, sc, bi] = mats[0];
                let mut args = vec![
                    Ptr(ptr(0)),
                    I32(m as i32),
                    Ptr(w),
                    Ptr(sc),
                    Ptr(bi),
                    I32(fcode(input(2).dtype)?),
                    Ptr(out),
                    I32(fcode(node.dtype)?),
                    I64(nn as i64),
                    I64(k as i64),
                    I32(group),
                ];
                args.extend(stages.map(I32));
                return gpu.launch_gemv(&l, &args);
            }
            gpu.launch("qmm", blocks(m * nn * 32), THREADS, 0, &args)
        }
        Op::GatherQuantizedMatMul { bits, group_size } => {
            let sx = &input(0).shape;
            let (k, x_rows) = (sx[sx.len() - 1], sx[sx.len() - 2]);
            let sw = &input(1).shape;
            let (experts, nn) = (sw[0], sw[1]);
            let pairs: usize = input(4).shape.iter().product();
            let top = *input(4).shape.last().unwrap();
            let args = [
                Ptr(ptr(0)),
                I32(fcode(input(0).dtype)?),
                I64(x_rows as i64),
                Ptr(ptr(1)),
                Ptr(ptr(2)),
                Ptr(ptr(3)),
                I32(fcode(input(2).dtype)?),
                Ptr(ptr(4)),
                I32(icode(input(4).dtype)?),
                Ptr(out),
                I32(fcode(node.dtype)?),
                I64(pairs as i64),
                I64(top as i64),
                I64(experts as i64),
                I64(nn as i64),
                I64(k as i64),
                I32(*bits as i32),
                I32(*group_size as i32),
                Ptr(error),
                I32(tag),
            ];
            if pairs <= GATHER_GEMV_PAIRS && matches!(bits, 4 | 8) && group_size % 32 == 0 && k % group_size == 0 {
                // Decode: one block row per (token, slot) pair, the GEMV kernels' inner loop
                // (same parameters as gather_qmm).
                if let Some(l) = tc_gemv_kernel("gather_qgemv", input(0).dtype, *bits, 1, nn * pairs, k) {
                    let grid = (nn.div_ceil(16) as u32, pairs as u32);
                    let block = gather_block(gpu, l.name, grid, l.block, l.smem, k, "MLXCEL_GATHER_WARPS")?;
                    return gpu.launch_grid(l.name, grid, block, l.smem, &args);
                }
                let l = gemv_kernel("gather_qgemv", input(0).dtype, bits_name(*bits), 1, nn, k)?;
                return gpu.launch_grid(l.name, (l.grid, pairs as u32), l.block, l.smem, &args);
            }
            if let (Some(g), true) = (grouped_qmm_kernel(graph, i), scratch != 0) {
                // Prefill: the pairs grouped by expert and cut into tiles (scratch: order,
                // offsets, then the tiles), then a block a tile and 64 or 128 weight rows.
                let order = scratch;
                let offsets = order + 4 * pairs as u64;
                let tiles = offsets + 4 * (experts as u64 + 1);
                gpu.launch(
                    "moe_sort",
                    1,
                    1024,
                    0,
                    &[
                        Ptr(ptr(4)),
                        I32(icode(input(4).dtype)?),
                        I64(pairs as i64),
                        I64(experts as i64),
                        Ptr(order),
                        Ptr(offsets),
                        Ptr(tiles),
                        I32(g.pairs as i32),
                        Ptr(error),
                        I32(tag),
                    ],
                )?;
                let grouped = [
                    Ptr(ptr(0)),
                    I64(x_rows as i64),
                    Ptr(ptr(1)),
                    Ptr(ptr(2)),
                    Ptr(ptr(3)),
                    I32(fcode(input(2).dtype)?),
                    Ptr(order),
                    Ptr(offsets),
                    Ptr(tiles),
                    Ptr(out),
                    I32(fcode(node.dtype)?),
                    I64(top as i64),
                    I64(nn as i64),
                    I64(k as i64),
                    I32(*group_size as i32),
                ];
                let grid = (nn.div_ceil(g.rows) as u32, g.max_tiles(pairs, experts) as u32);
                return gpu.launch_grid(g.name, grid, 128, 0, &grouped);
            }
            gpu.launch("gather_qmm", blocks(pairs * nn * 32), THREADS, 0, &args)
        }
        Op::RmsNorm { eps, unit_offset } => {
            let d = *node.shape.last().unwrap();
            let args = [
                Ptr(ptr(0)),
                I32(fcode(input(0).dtype)?),
                Ptr(ptr(1)),
                I32(fcode(input(1).dtype)?),
                Ptr(out),
                I32(fcode(node.dtype)?),
                I64(d as i64),
                F32(*eps),
                I32(i32::from(*unit_offset)),
            ];
            gpu.launch("rms_norm", (n / d.max(1)) as u32, THREADS, 0, &args)
        }
        Op::LayerNorm {
            eps,
            has_weight,
            has_bias,
        } => {
            let d = *node.shape.last().unwrap();
            let w = if *has_weight { ptr(1) } else { 0 };
            let b = if *has_bias {
                ptr(1 + usize::from(*has_weight))
            } else {
                0
            };
            let pdt = if node.inputs.len() > 1 {
                fcode(input(1).dtype)?
            } else {
                0
            };
            let args = [
                Ptr(ptr(0)),
                I32(fcode(input(0).dtype)?),
                Ptr(w),
                Ptr(b),
                I32(pdt),
                I32(i32::from(*has_weight)),
                I32(i32::from(*has_bias)),
                Ptr(out),
                I32(fcode(node.dtype)?),
                I64(d as i64),
                F32(*eps),
            ];
            gpu.launch("layer_norm", (n / d.max(1)) as u32, THREADS, 0, &args)
        }
        Op::Rope {
            dims,
            interleaved,
            scale,
        } => {
            let s = &node.shape;
            let mut args = rope_inputs(graph, i, &ptr)?;
            args.extend([
                Ptr(out),
                I64(s[0] as i64),
                I64(s[1] as i64),
                I64(s[2] as i64),
                I64(s[3] as i64),
                I64(*dims as i64),
                I32(i32::from(*interleaved)),
                F32(*scale),
            ]);
            gpu.launch("rope", blocks(n), THREADS, 0, &args)
        }
        Op::Attention {
            scale,
            causal,
            window,
            softcap,
        }
        | Op::PagedAttention {
            scale,
            causal,
            window,
            softcap,
            ..
        } => {
            let Some(a) = attention_shape(graph, i) else {
                unreachable!("an attention node")
            };
            // q, k, v and the length: the leading parameters of every attention kernel.
            let operands = [
                Ptr(ptr(0)),
                I32(fcode(input(0).dtype)?),
                Ptr(ptr(1)),
                Ptr(ptr(2)),
                I32(fcode(input(1).dtype)?),
                Ptr(ptr(3)),
                I32(icode(input(3).dtype)?),
                I32(input(3).shape.iter().product::<usize>() as i32),
            ];
            // The paged kernels' trailing parameters: the table, its width, block size and blocks.
            let pages = match a.pages {
                Some(p) => vec![
                    Ptr(ptr(4)),
                    I32(icode(input(4).dtype)?),
                    I64(p.width as i64),
                    I64(p.block_size as i64),
                    I64(p.blocks as i64),
                ],
                None => Vec::new(),
            };
            let paged = a.pages.is_some();
            let mut args = operands.to_vec();
            args.extend([
                Ptr(out),
                I32(fcode(node.dtype)?),
                I64(a.hq as i64),
                I64(a.hkv as i64),
                I64(a.t as i64),
                I64(a.s as i64),
                I64(a.d as i64),
                I64(a.dv as i64),
                F32(*scale),
                I32(i32::from(*causal)),
                I64(window.map_or(0, |w| w as i64)),
                F32(softcap.unwrap_or(0.0)),
                Ptr(error),
                I32(tag),
            ]);
            args.extend(pages.iter().cloned());
            let rows = a.b * a.hq * a.t;
            if let (Some(splits), true) = (decode_attention_splits(graph, i), scratch != 0) {
                let chunk = a.s.div_ceil(splits);
                // The split kernel merges its partials itself (its last block a row group), or
                // leaves them to attention_combine (`MLXCEL_ATT_MERGE=0`): the tickets follow the
                // partials in the node's scratch (partials_scratch).
                let gqa = gqa_decode_kernel(graph, i);
                let merge = split_merge(gqa.is_some());
                let tickets = scratch + (rows * splits * (a.dv + 2) * 4) as u64;
                let mut split_args = operands.to_vec();
                split_args.extend([
                    Ptr(scratch),
                    Ptr(if merge { tickets } else { 0 }),
                    Ptr(out),
                    I32(fcode(node.dtype)?),
                    I64(a.hq as i64),
                    I64(a.hkv as i64),
                    I64(a.s as i64),
                    I64(a.d as i64),
                    I64(a.dv as i64),
                    F32(*scale),
                    I32(i32::from(*causal)),
                    I64(window.map_or(0, |w| w as i64)),
                    F32(softcap.unwrap_or(0.0)),
                    I64(chunk as i64),
                    Ptr(error),
                    I32(tag),
                ]);
                split_args.extend(pages);
                if let Some(r) = rope {
                    split_args.extend(r.iter().cloned());
                }
                // The grouped kernel takes the same parameters, a block per kv head.
                let (name, blocks, smem) = match gqa {
                    // The online kernel's shared memory: per-warp outputs, max and sum
                    // [4][GM][D + 2] (nn.cu, GM = 4 heads a group).
                    Some(lane) if online_attention() => (
                        match (lane, paged) {
                            (4, false) => "attention_gqa_online_4",
                            (4, true) => "attention_gqa_online_paged_4",
                            (_, false) => "attention_gqa_online_8",
                            (_, true) => "attention_gqa_online_paged_8",
                        },
                        a.b * a.hkv,
                        4 * 4 * 4 * (32 * lane + 2),
                    ),
                    // Shared memory (nn.cu, GM = 4 heads a group): scores [GM][chunk], per-warp
                    // outputs [4][GM][D], max and sum [2][GM].
                    Some(lane) => (
                        match (lane, paged) {
                            (4, false) => "attention_gqa_4",
                            (4, true) => "attention_gqa_paged_4",
                            (_, false) => "attention_gqa_8",
                            (_, true) => "attention_gqa_paged_8",
                        },
                        a.b * a.hkv,
                        4 * (4 * chunk + 4 * 4 * 32 * lane + 2 * 4),
                    ),
                    None => match lanes_attention_kernel(graph, i, if paged { "_paged" } else { "" }) {
                        Some(name) => (name, rows / lanes_group(graph, i), 0),
                        None if paged => ("attention_split_paged", rows, 0),
                        None => ("attention_split", rows, 0),
                    },
                };
                let name = match rope {
                    Some(_) => rope_attention_kernel(graph, i)
                        .ok_or_else(|| Error::Backend(format!("{name}: no variant takes the queries' rope")))?,
                    None => name,
                };
                let grid = (blocks as u32, splits as u32);
                match early_attention(name) {
                    Some(early) if rope.is_none() => {
                        gpu.launch_ex(early, grid, 128, smem as u32, &split_args, true, 1)?
                    }
                    _ => gpu.launch_grid(name, grid, 128, smem as u32, &split_args)?,
                }
                if merge {
                    return Ok(());
                }
                let combine = [
                    Ptr(scratch),
                    I64(splits as i64),
                    I64(a.dv as i64),
                    Ptr(out),
                    I32(fcode(node.dtype)?),
                ];
                return gpu.launch("attention_combine", rows as u32, 128, 0, &combine);
            }
            if rope.is_some() {
                return Err(Error::Backend(
                    "rope folded into an attention that no split kernel runs".into(),
                ));
            }
            if let Some(name) = flash_prefill_kernel(graph, i) {
                let grid = (a.t.div_ceil(64) as u32, (a.b * a.hq) as u32);
                args.push(I32(i32::from(heads_last)));
                return gpu.launch_grid(name, grid, 128, 0, &args);
            }
            if heads_last {
                return Err(Error::Backend(
                    "heads-last output without the flash prefill kernel".into(),
                ));
            }
            let name = if paged { "attention_paged" } else { "attention" };
            gpu.launch(name, rows as u32, 128, (a.s * 4) as u32, &args)
        }
        Op::KvWrite => {
            let sn = &input(1).shape;
            let mut args = vec![Ptr(out), Ptr(ptr(1)), I32(node.dtype.size() as i32)];
            args.extend(cache_write_place(graph, i, sn, ptr(2), error, tag)?);
            gpu.launch("kv_write", blocks(sn.iter().product()), THREADS, 0, &args)
        }
        Op::Gather => {
            let st = &input(0).shape;
            let row = st[1] * node.dtype.size();
            let count: usize = input(1).shape.iter().product();
            let args = [
                Ptr(ptr(0)),
                I64(st[0] as i64),
                I64(row as i64),
                Ptr(ptr(1)),
                I32(icode(input(1).dtype)?),
                I64(count as i64),
                Ptr(out),
                Ptr(error),
                I32(tag),
            ];
            gpu.launch("gather_rows", blocks(count * row), THREADS, 0, &args)
        }
        Op::QuantizedGather { bits, group_size } => {
            let d = *node.shape.last().unwrap();
            let count: usize = input(3).shape.iter().product();
            let args = [
                Ptr(ptr(0)),
                Ptr(ptr(1)),
                Ptr(ptr(2)),
                I32(fcode(input(1).dtype)?),
                I64(input(0).shape[0] as i64),
                I64(d as i64),
                I32(*bits as i32),
                I32(*group_size as i32),
                Ptr(ptr(3)),
                I32(icode(input(3).dtype)?),
                I64(count as i64),
                Ptr(out),
                I32(fcode(node.dtype)?),
                Ptr(error),
                I32(tag),
            ];
            gpu.launch("quantized_gather", blocks(count * d), THREADS, 0, &args)
        }
        Op::TakeAlongAxis { axis } => {
            let (outer, len, inner) = dims(&input(0).shape, *axis);
            let m = input(1).shape[*axis];
            let args = [
                Ptr(ptr(0)),
                I32(node.dtype.size() as i32),
                I64(outer as i64),
                I64(len as i64),
                I64(inner as i64),
                Ptr(ptr(1)),
                I32(icode(input(1).dtype)?),
                I64(m as i64),
                Ptr(out),
                Ptr(error),
                I32(tag),
            ];
            gpu.launch("take_along", blocks(n), THREADS, 0, &args)
        }
        Op::TopK { .. } | Op::ArgSort { .. } => {
            let row = *input(0).shape.last().unwrap();
            let rows = input(0).shape.iter().product::<usize>() / row.max(1);
            let (descending, keep, high) = match &node.op {
                Op::TopK { k, higher_on_ties } => (1, *k, i32::from(*higher_on_ties)),
                Op::ArgSort { descending } => (i32::from(*descending), row, 0),
                _ => unreachable!(),
            };
            if matches!(node.op, Op::TopK { .. }) && row <= 1024 {
                // A warp a row (the router's few dozen or hundred experts), 8 rows a block.
                let args = [
                    Ptr(ptr(0)),
                    I32(fcode(input(0).dtype)?),
                    I64(rows as i64),
                    I64(row as i64),
                    I64(keep as i64),
                    Ptr(out),
                    I32(high),
                ];
                return gpu.launch("topk_warp", rows.div_ceil(8) as u32, 256, 0, &args);
            }
            let args = [
                Ptr(ptr(0)),
                I32(fcode(input(0).dtype)?),
                I64(rows as i64),
                I64(row as i64),
                I32(descending),
                I64(keep as i64),
                Ptr(out),
                Ptr(scratch),
                I32(high),
            ];
            gpu.launch("argsort_rows", blocks(rows), THREADS, 0, &args)
        }
        Op::SampleCategorical { seed } => {
            let s = &input(0).shape;
            let args = [
                Ptr(ptr(0)),
                I32(fcode(input(0).dtype)?),
                I64(s[1] as i64),
                Ptr(ptr(1)),
                U64(*seed),
                Ptr(out),
            ];
            gpu.launch("sample_categorical", s[0] as u32, THREADS, 0, &args)
        }
        Op::Transpose { perm } => {
            let st = strides(&input(0).shape);
            let src: Vec<i64> = perm.iter().map(|&p| st[p]).collect();
            let v = view(&node.shape, &src, 0, &strides(&node.shape), 0)?;
            copy(gpu, ptr(0), out, node.dtype.size(), v, n)
        }
        Op::Slice { start, step, .. } => {
            let st = strides(&input(0).shape);
            let off = start.iter().zip(&st).map(|(&a, &s)| a as i64 * s).sum();
            let src: Vec<i64> = st.iter().zip(step).map(|(&s, &k)| s * k as i64).collect();
            let v = view(&node.shape, &src, off, &strides(&node.shape), 0)?;
            copy(gpu, ptr(0), out, node.dtype.size(), v, n)
        }
        Op::Broadcast => {
            let sh = &input(0).shape;
            let src: Vec<i64> = strides(sh)
                .iter()
                .zip(sh)
                .map(|(&s, &d)| if d == 1 { 0 } else { s })
                .collect();
            let v = view(&node.shape, &src, 0, &strides(&node.shape), 0)?;
            copy(gpu, ptr(0), out, node.dtype.size(), v, n)
        }
        Op::Concat { axis } => {
            let dst = strides(&node.shape);
            let mut at = 0i64;
            for k in 0..node.inputs.len() {
                let sh = &input(k).shape;
                let v = view(sh, &strides(sh), 0, &dst, at * dst[*axis])?;
                copy(gpu, ptr(k), out, node.dtype.size(), v, sh.iter().product())?;
                at += sh[*axis] as i64;
            }
            Ok(())
        }
    }
}

fn copy(gpu: &Gpu, src: u64, dst: u64, size: usize, v: View8, n: usize) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    gpu.launch(
        "strided_copy",
        blocks(n),
        THREADS,
        0,
        &[
            Arg::Ptr(src),
            Arg::Ptr(dst),
            Arg::I32(size as i32),
            Arg::View(Box::new(v)),
            Arg::I64(n as i64),
        ],
    )
}

/// Launches the fused kernel anchored at node `i`; `at(j)` is the device pointer of node `j`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn fused(
    gpu: &Gpu,
    graph: &Graph,
    i: usize,
    f: &super::fuse::Fused,
    at: &dyn Fn(usize) -> u64,
    scratch: u64,
    error: u64,
    tag: i32,
) -> Result<()> {
    use super::fuse::Fused;
    use Arg::{Ptr, F32, I32, I64};
    let node = &graph.nodes[i];
    let input = |j: usize, k: usize| graph.nodes[j].inputs[k].index();
    match f {
        Fused::Glu {
            x,
            g,
            u,
            act,
            norm,
            route,
        } => {
            let ng = &graph.nodes[*g];
            let xs = &graph.node(*x).shape;
            let k = *xs.last().unwrap();
            let rows = xs.iter().product::<usize>() / k;
            let n = *node.shape.last().unwrap();
            let codes = [
                I32(fcode(node.dtype)?),
                I32(fcode(ng.dtype)?),
                // The activation's dtype and, above it, its unary code (gemv.cu, glu_out).
                I32(fcode(graph.nodes[*act].dtype)? | (act_code(&graph.nodes[*act].op) << 8)),
            ];
            let xdt = graph.node(*x).dtype;
            // A batched step's GLU on qmm_ring_glu (fusion took it for that).
            if let Some(q) = (rows > 1 && norm.is_none()).then(|| qmm_glu_plan(graph, *g)).flatten() {
                let mats = [*g, *u].map(|j| [input(j, 1), input(j, 2), input(j, 3)]);
                return qmm_glu(gpu, graph, &q, mats, at, codes, x.index(), at(i), scratch);
            }
            match ng.op {
                Op::QuantizedMatMul { bits, group_size } => {
                    let tc = tc_gemv_kernel("qglu", xdt, bits, rows, n, k);
                    let on_tensor_cores = tc.is_some();
                    let (l, stages) = match tc {
                        Some(l) => tc_ring(l, 2, k, group_size, graph.node(ng.inputs[2]).dtype),
                        None if norm.is_none() => (gemv_kernel("qglu", xdt, bits_name(bits), rows, n, k)?, None),
                        None => return Err(no_tensor_cores("GLU")),
                    };
                    let mut mats = [*g, *u].map(|j| [at(input(j, 1)), at(input(j, 2)), at(input(j, 3))]);
                    let group = if on_tensor_cores && stages.is_none() {
                        tc_group(gpu, &mut mats, group_size)
                    } else {
                        group_size as i32
                    };
                    let mut args = vec![Ptr(at(x.index())), I32(rows as i32)];
                    for m in mats {
                        args.extend(m.map(Ptr));
                    }
                    args.push(I32(fcode(graph.node(ng.inputs[2]).dtype)?));
                    args.push(Ptr(at(i)));
                    args.extend(codes);
                    args.extend([I64(n as i64), I64(k as i64), I32(group)]);
                    if on_tensor_cores {
                        args.extend(norm_in_args(graph, norm, at)?);
                    }
                    args.extend(stages.map(I32));
                    gpu.launch_gemv(&l, &args)
                }
                Op::GatherQuantizedMatMul { bits, group_size } => {
                    let (sx, sw) = (&graph.node(*x).shape, &graph.node(ng.inputs[1]).shape);
                    let ids = graph.node(ng.inputs[4]);
                    let pairs: usize = ids.shape.iter().product();
                    let l = tc_gemv_kernel("gather_qgemv", xdt, bits, 1, n * pairs, k)
                        .ok_or_else(|| no_tensor_cores("routed GLU"))?;
                    let mut args = vec![Ptr(at(x.index())), I64(sx[sx.len() - 2] as i64)];
                    for j in [*g, *u] {
                        args.extend([Ptr(at(input(j, 1))), Ptr(at(input(j, 2))), Ptr(at(input(j, 3)))]);
                    }
                    args.extend([I32(fcode(graph.node(ng.inputs[2]).dtype)?), Ptr(at(input(*g, 4)))]);
                    if route.is_none() {
                        args.push(I32(icode(ids.dtype)?));
                    }
                    args.push(Ptr(at(i)));
                    args.extend(codes);
                    args.extend([
                        I64(*ids.shape.last().unwrap() as i64),
                        I64(sw[0] as i64),
                        I64(n as i64),
                        I64(k as i64),
                        I32(group_size as i32),
                        Ptr(error),
                        I32(tag),
                    ]);
                    // With the router inside (fuse.rs Route): its logits, their dtype, the expert
                    // count, the tie rule, the renormalization and where its weights go; the
                    // launch writes the ids (the top-k's output) rather than reading them.
                    let family = match route {
                        Some(r) => {
                            let Op::TopK { higher_on_ties, .. } = graph.nodes[r.topk].op else {
                                unreachable!("a Route holds a topk")
                            };
                            let probs = &graph.nodes[r.softmax];
                            args.extend([
                                Ptr(at(input(r.softmax, 0))),
                                I32(fcode(probs.dtype)?),
                                I64(*probs.shape.last().unwrap() as i64),
                                I32(i32::from(higher_on_ties)),
                                I32(i32::from(r.renorm)),
                                Ptr(at(r.anchor)),
                            ]);
                            "tc_gather_qglu_route_"
                        }
                        None => "tc_gather_qglu_",
                    };
                    let name = intern(l.name.replacen("tc_gather_qgemv_", family, 1));
                    let grid = (n.div_ceil(16) as u32, pairs as u32);
                    let block = gather_block(gpu, name, grid, l.block, l.smem, k, "MLXCEL_GATHER_GLU_WARPS")?;
                    gpu.launch_grid(name, grid, block, l.smem, &args)
                }
                _ => {
                    let w = fsuffix(graph.node(ng.inputs[1]).dtype)?;
                    let staged = norm_staging(norm, k, "dense GLU")?;
                    if let Some(split) = dense_split(xdt, rows, n, k) {
                        let name = intern(format!("dsk_glu_{}_{w}", fsuffix(xdt)?));
                        let mut args = vec![
                            Ptr(at(x.index())),
                            Ptr(at(input(*g, 1))),
                            Ptr(at(input(*u, 1))),
                            Ptr(at(i)),
                        ];
                        args.extend(codes);
                        args.extend([I64(n as i64), I64(k as i64), I32(split as i32)]);
                        args.extend(norm_in_args(graph, norm, at)?);
                        return gpu.launch(name, dsk_blocks(n, split), DSK_THREADS, staged, &args);
                    }
                    let mut l = gemv_kernel("dglu", xdt, w, rows, n, k)?;
                    if norm.is_some() {
                        l.smem = staged;
                    }
                    let mut args = vec![
                        Ptr(at(x.index())),
                        I32(rows as i32),
                        Ptr(at(input(*g, 1))),
                        Ptr(at(input(*u, 1))),
                        Ptr(at(i)),
                    ];
                    args.extend(codes);
                    args.extend([I64(n as i64), I64(k as i64)]);
                    args.extend(norm_in_args(graph, norm, at)?);
                    gpu.launch(l.name, l.grid, l.block, l.smem, &args)
                }
            }
        }
        Fused::AddRmsNorm { add } => {
            let Op::RmsNorm { eps, unit_offset } = node.op else {
                unreachable!("AddRmsNorm anchors on a norm")
            };
            let d = *node.shape.last().unwrap();
            let n: usize = node.shape.iter().product();
            let sum = &graph.nodes[*add];
            let args = [
                Ptr(at(input(*add, 0))),
                Ptr(at(input(*add, 1))),
                Ptr(at(*add)),
                I32(fcode(sum.dtype)?),
                Ptr(at(input(i, 1))),
                I32(fcode(graph.node(node.inputs[1]).dtype)?),
                Ptr(at(i)),
                I32(fcode(node.dtype)?),
                I64(d as i64),
                F32(eps),
                I32(i32::from(unit_offset)),
            ];
            // A block of up to 1024 threads a row keeps the row in registers (nn.cu).
            let block = d.div_ceil(8).next_multiple_of(32).clamp(32, 1024) as u32;
            // `MLXCEL_ARN_RAW=1`: the form that requests every value as raw bits in one batch
            // (nn.cu add_rms_norm_raw; opt-in, not yet measured).
            static RAW: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
            let name = if switch(&RAW, "MLXCEL_ARN_RAW", false) {
                "add_rms_norm_raw"
            } else {
                "add_rms_norm"
            };
            gpu.launch(name, (n / d.max(1)) as u32, block, 0, &args)
        }
        Fused::RopeKvWrite { rope } => {
            let r = &graph.nodes[*rope];
            let Op::Rope {
                dims,
                interleaved,
                scale,
            } = r.op
            else {
                unreachable!("RopeKvWrite holds a rope")
            };
            let mut args = rope_inputs(graph, *rope, &|k| at(input(*rope, k)))?;
            args.extend([I64(dims as i64), I32(i32::from(interleaved)), F32(scale), Ptr(at(i))]);
            args.extend(cache_write_place(graph, i, &r.shape, at(input(i, 2)), error, tag)?);
            gpu.launch("rope_kv_write", blocks(r.shape.iter().product()), THREADS, 0, &args)
        }
        Fused::Router { softmax, topk, renorm } => {
            let Op::TopK { k, higher_on_ties } = graph.nodes[*topk].op else {
                unreachable!("Router holds a topk")
            };
            let probs = &graph.nodes[*softmax];
            let experts = *probs.shape.last().unwrap();
            let rows = probs.shape.iter().product::<usize>() / experts.max(1);
            let args = [
                Ptr(at(input(*softmax, 0))),
                I32(fcode(probs.dtype)?),
                I64(rows as i64),
                I64(experts as i64),
                I64(k as i64),
                I32(i32::from(higher_on_ties)),
                I32(i32::from(*renorm)),
                Ptr(at(*topk)),
                Ptr(at(i)),
                I32(i32::from(switch(&KEYED, "MLXCEL_ROUTE_KEYED", true))),
            ];
            // A warp a row, 8 rows a block (index.cu), the top k selected by one 64-bit key a
            // candidate without branches (MLXCEL_ROUTE_KEYED=0: the comparison-based selection,
            // for comparison; the H100 MoE decode 245.1 -> 261.6 tok/s with keys).
            static KEYED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
            gpu.launch("moe_route", rows.div_ceil(8) as u32, 256, 0, &args)
        }
        Fused::WeightedSum { mul, y, w } => {
            let shape = &graph.nodes[*mul].shape;
            let (k, d) = (shape[shape.len() - 2], shape[shape.len() - 1]);
            let rows = shape.iter().product::<usize>() / (k * d).max(1);
            let args = [
                Ptr(at(y.index())),
                Ptr(at(w.index())),
                I32(fcode(node.dtype)?),
                I64(rows as i64),
                I64(k as i64),
                I64(d as i64),
                Ptr(at(i)),
            ];
            // Decode: a warp an output, 8 a block; prefill: a thread an output, or 8 adjacent
            // ones for 16-bit values, k <= 8 and d a multiple of 8 (reduce.cu).
            if rows > GATHER_GEMV_PAIRS {
                let eight = k <= 8
                    && d.is_multiple_of(8)
                    && matches!(node.dtype, mlxcel_core::DType::F16 | mlxcel_core::DType::BF16);
                if eight {
                    return gpu.launch("weighted_sum_rows8", blocks(rows * d / 8), THREADS, 0, &args);
                }
                return gpu.launch("weighted_sum_rows", blocks(rows * d), THREADS, 0, &args);
            }
            static EARLY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
            let name = if switch(&EARLY, "MLXCEL_PDL_COMBINE", false) {
                "weighted_sum_pdl"
            } else {
                "weighted_sum"
            };
            gpu.launch(name, (rows * d).div_ceil(8) as u32, 256, 0, &args)
        }
        Fused::ActMul { act, u } => {
            let Op::Unary(op) = graph.nodes[*act].op else {
                unreachable!("ActMul holds a unary")
            };
            let name = match fsuffix(node.dtype)? {
                "f32" => "act_mul_f32",
                "f16" => "act_mul_f16",
                _ => "act_mul_bf16",
            };
            let n = node.shape.iter().product::<usize>();
            let args = [
                I32(unary_code(op).0),
                Ptr(at(input(*act, 0))),
                Ptr(at(u.index())),
                Ptr(at(i)),
                I64(n as i64),
            ];
            gpu.launch(name, blocks(n), THREADS, 0, &args)
        }
        Fused::HeadsLastAttention { attn } => {
            let inputs = |k: usize| at(input(*attn, k));
            self::node(gpu, graph, *attn, &inputs, at(i), 0, error, tag, true, None)
        }
        Fused::RopeAttention { q, k, v } => {
            let Op::Rope {
                dims,
                interleaved,
                scale,
            } = graph.nodes[*q].op
            else {
                unreachable!("RopeAttention holds the queries' rope")
            };
            let rope_k = input(*k, 1);
            // rope's positions and frequencies (rope_inputs' third to seventh), then the write
            // position of the keys' cache write.
            let lead = rope_inputs(graph, *q, &|j| at(input(*q, j)))?;
            let wpos = graph.node(graph.nodes[*k].inputs[2]);
            let mut rope = vec![Ptr(at(input(rope_k, 0))), Ptr(at(input(*v, 1)))];
            rope.extend(lead[2..].iter().cloned());
            rope.extend([I64(dims as i64), I32(i32::from(interleaved)), F32(scale)]);
            rope.extend([
                Ptr(at(input(*k, 2))),
                I32(icode(wpos.dtype)?),
                I32(wpos.shape.iter().product::<usize>() as i32),
            ]);
            // The attention's q is the queries before rope.
            let inputs = |j: usize| if j == 0 { at(input(*q, 0)) } else { at(input(i, j)) };
            self::node(gpu, graph, i, &inputs, at(i), scratch, error, tag, false, Some(&rope))
        }
        Fused::RopeQkvWrite {
            q,
            k,
            v,
            heads_last,
            norms,
        } => {
            let (rq, rk) = (&graph.nodes[*q], input(*k, 1));
            let Op::Rope {
                dims,
                interleaved,
                scale,
            } = rq.op
            else {
                unreachable!("RopeQkvWrite holds the queries' rope")
            };
            let (sq, sk) = (&rq.shape, &graph.nodes[rk].shape);
            let dv = *graph.node(graph.nodes[*v].inputs[1]).shape.last().unwrap();
            // rope's leading parameters for q (x, dtype, positions, frequencies), split around
            // the k and v pointers the kernel takes after q's.
            // With heads_last, each source is its absorbed transpose's input.
            let source = |user: usize, slot: usize| {
                let x = input(user, slot);
                at(if *heads_last {
                    graph.nodes[x].inputs[0].index()
                } else {
                    x
                })
            };
            // With the per-head norms folded in, q and k are the norms' inputs ([B, T, H, D]).
            let (q_in, k_in) = match norms {
                Some([nq, nk]) => (at(input(*nq, 0)), at(input(*nk, 0))),
                None => (source(*q, 0), source(rk, 0)),
            };
            let lead = rope_inputs(graph, *q, &|j| if j == 0 { q_in } else { at(input(*q, j)) })?;
            let mut args = vec![lead[0].clone(), Ptr(at(*q)), I64(sq[1] as i64)];
            args.extend([Ptr(k_in), Ptr(at(*k))]);
            args.extend([Ptr(source(*v, 1)), Ptr(at(*v)), I64(dv as i64)]);
            args.extend(lead[1..].iter().cloned());
            args.extend([I64(dims as i64), I32(i32::from(interleaved)), F32(scale)]);
            let place = cache_write_place(graph, *k, sk, at(input(*k, 2)), error, tag)?;
            args.extend(place);
            args.push(I32(i32::from(*heads_last)));
            let keys: usize = sk.iter().product();
            if let Some(norms) = norms {
                args.extend(qk_norm_args(graph, *norms, at)?);
                // A warp a head row of q, k and v, 8 a block (nn.cu).
                let rows = (sq.iter().product::<usize>() + 2 * keys) / sk[3].max(1);
                return gpu.launch("rope_qkv_norm_write", rows.div_ceil(8) as u32, 256, 0, &args);
            }
            let n = sq.iter().product::<usize>() + keys + keys / sk[3].max(1) * dv;
            gpu.launch("rope_qkv_write", blocks(n), THREADS, 0, &args)
        }
        Fused::Products {
            parts,
            biases,
            norm,
            rope: Some(rope),
            qk_norms,
        } => products_rope(
            gpu,
            graph,
            (parts, biases, norm),
            (*rope, *qk_norms),
            &at,
            scratch,
            error,
            tag,
        ),
        Fused::Products {
            parts,
            biases,
            norm,
            rope: None,
            ..
        } => {
            let first = &graph.nodes[parts[0]];
            let x = graph.node(first.inputs[0]);
            let k = *x.shape.last().unwrap();
            let rows = |p: usize| *graph.nodes[p].shape.last().unwrap();
            let total: usize = parts.iter().map(|&p| rows(p)).sum();
            // Per product slot: its weight tensors (a dense weight, or packed weights, scales
            // and biases), its output (the bias sum's, with biases) and its rows; zeros for an
            // unused slot.
            let tensors = first.inputs.len() - 1;
            let outs: Vec<usize> = (0..parts.len())
                .map(|slot| biases.get(slot).copied().unwrap_or(parts[slot]))
                .collect();
            let mut args = product_slot_args(graph, parts, &outs, at);
            let bias_args = product_bias_args(graph, parts, biases, at);
            // A batched step's products on qmm_ring3 (fusion took them for that).
            if let Some(q) = norm.is_none().then(|| qmm_products_plan(graph, parts)).flatten() {
                let codes = [I32(fcode(graph.node(first.inputs[2]).dtype)?), I32(fcode(first.dtype)?)];
                return qmm_products(gpu, &q, args, codes, bias_args, scratch);
            }
            match first.op {
                Op::QuantizedMatMul { bits, group_size } => {
                    let l = tc_gemv_kernel("qgemv", x.dtype, bits, 1, total, k)
                        .ok_or_else(|| no_tensor_cores("fused products"))?;
                    let (l, stages) = tc_ring(l, 1, k, group_size, graph.node(first.inputs[2]).dtype);
                    let mut group = group_size as i32;
                    if stages.is_none() {
                        // Each part's weight, scales and biases lead its slot's arguments.
                        let mut mats: Vec<[u64; 3]> =
                            parts.iter().map(|&p| [1, 2, 3].map(|j| at(input(p, j)))).collect();
                        group = tc_group(gpu, &mut mats, group_size);
                        for (slot, m) in mats.iter().enumerate() {
                            for (j, &p) in m.iter().enumerate() {
                                args[1 + (tensors + 2) * slot + j] = Ptr(p);
                            }
                        }
                    }
                    args.extend([
                        I32(fcode(graph.node(first.inputs[2]).dtype)?),
                        I32(fcode(first.dtype)?),
                        I64(k as i64),
                        I32(group),
                    ]);
                    args.extend(norm_in_args(graph, norm, at)?);
                    args.extend(bias_args);
                    args.extend(stages.map(I32));
                    let l = GemvLaunch {
                        name: intern(l.name.replacen("tc_qgemv_", "tc_qgemv3_", 1)),
                        ..l
                    };
                    gpu.launch_gemv(&l, &args)
                }
                _ => {
                    let smem = norm_staging(norm, k, "fused dense products")?;
                    let split = dense_split(x.dtype, 1, total, k);
                    args.extend([I32(fcode(first.dtype)?), I64(k as i64)]);
                    args.extend(split.map(|g| I32(g as i32)));
                    args.extend(norm_in_args(graph, norm, at)?);
                    args.extend(bias_args);
                    let w = fsuffix(graph.node(first.inputs[1]).dtype)?;
                    match split {
                        Some(g) => {
                            let name = intern(format!("dsk_gemv3_{}_{w}", fsuffix(x.dtype)?));
                            gpu.launch(name, dsk_blocks(total, g), DSK_THREADS, smem, &args)
                        }
                        None => {
                            // One weight row a warp, four warps a block.
                            let name = intern(format!("dgemv3_{}_{w}", fsuffix(x.dtype)?));
                            gpu.launch(name, total.div_ceil(4) as u32, 128, smem, &args)
                        }
                    }
                }
            }
        }
    }
}

/// The leading arguments of a launch of up to three products of one x (gemv.cu `tc_qgemv3`,
/// `dgemv3`, `dsk_gemv3`, qmm_ring3; nn.cu `tc_qgemv3_rope`): x, then per product slot its
/// weight tensors (a dense weight, or packed weights, scales and biases), the node it writes
/// (`outs`, one a part) and its rows; zeros for an unused slot.
fn product_slot_args(graph: &Graph, parts: &[usize], outs: &[usize], at: &dyn Fn(usize) -> u64) -> Vec<Arg> {
    let first = &graph.nodes[parts[0]];
    let tensors = first.inputs.len() - 1;
    let mut args = vec![Arg::Ptr(at(first.inputs[0].index()))];
    for slot in 0..3 {
        match (parts.get(slot), outs.get(slot)) {
            (Some(&p), Some(&out)) => {
                let node = &graph.nodes[p];
                args.extend(node.inputs[1..].iter().map(|w| Arg::Ptr(at(w.index()))));
                args.extend([Arg::Ptr(at(out)), Arg::I64(*node.shape.last().unwrap() as i64)]);
            }
            _ => {
                args.extend((0..=tensors).map(|_| Arg::Ptr(0)));
                args.push(Arg::I64(0));
            }
        }
    }
    args
}

/// gemv.cu's b0, b1, b2 of a products launch: each bias sum's bias vector, null where a slot
/// has none.
fn product_bias_args(graph: &Graph, parts: &[usize], biases: &[usize], at: &dyn Fn(usize) -> u64) -> Vec<Arg> {
    (0..3)
        .map(|slot| match (parts.get(slot), biases.get(slot)) {
            (Some(&p), Some(&s)) => Arg::Ptr(super::fuse::sum_bias(graph, s, p).map_or(0, |b| at(b.index()))),
            _ => Arg::Ptr(0),
        })
        .collect()
}

/// The launch of q, k and v's 4-bit products with their rope and cache writes (fuse.rs
/// `find_products_rope`; nn.cu `tc_qgemv3_rope`): tc_qgemv3's arguments with the turned queries'
/// buffer and the two caches as its outputs, then the rope's and the writes', then the per-head
/// norms' (`qk_norms`; null weights without) and their tickets (`scratch`, fused_scratch); or
/// the same without norms for dense weights on the loads-first GEMV (`dsk_gemv3_rope`). Always
/// the row-major 4-bit weights, one chunk in flight a warp: its tiles pair rows the tile-packed
/// layout and the ring do not.
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn products_rope(
    gpu: &Gpu,
    graph: &Graph,
    (parts, biases, norm): (&[usize], &[usize], &Option<super::fuse::NormIn>),
    ([q, k, v], qk_norms): ([usize; 3], Option<[usize; 2]>),
    at: &dyn Fn(usize) -> u64,
    scratch: u64,
    error: u64,
    tag: i32,
) -> Result<()> {
    use Arg::{Ptr, F32, I32, I64};
    let input = |node: usize, j: usize| graph.nodes[node].inputs[j].index();
    let first = &graph.nodes[parts[0]];
    let x = graph.node(first.inputs[0]);
    let kx = *x.shape.last().unwrap();
    let rows = |p: usize| *graph.nodes[p].shape.last().unwrap();
    let total: usize = parts.iter().map(|&p| rows(p)).sum();
    let Op::Rope { interleaved, scale, .. } = graph.nodes[q].op else {
        unreachable!("the rope-and-write's q is a rope")
    };
    let mut args = product_slot_args(graph, parts, &[q, k, v], at);
    // The dense kernel's split (rows a block), None for the 4-bit one.
    let dense = match first.op {
        Op::QuantizedMatMul { group_size, .. } => {
            args.extend([
                I32(fcode(graph.node(first.inputs[2]).dtype)?),
                I32(fcode(first.dtype)?),
                I64(kx as i64),
                I32(group_size as i32),
            ]);
            None
        }
        _ => {
            let g = dense_split(x.dtype, 1, total, kx).filter(|&g| g <= 4);
            let g = g.ok_or_else(|| Error::Backend("q, k and v with rope: no loads-first dense GEMV".into()))?;
            args.extend([I32(fcode(first.dtype)?), I64(kx as i64), I32(g as i32)]);
            Some(g)
        }
    };
    args.extend(norm_in_args(graph, norm, at)?);
    args.extend(product_bias_args(graph, parts, biases, at));
    let (pos, freq) = (
        graph.node(graph.nodes[q].inputs[1]),
        graph.node(graph.nodes[q].inputs[2]),
    );
    let d = *graph.nodes[q].shape.last().unwrap();
    let cache = &graph.nodes[k].shape; // [1, Hkv, S, D]
    let dv = *graph.nodes[v].shape.last().unwrap();
    let wpos = graph.node(graph.nodes[k].inputs[2]);
    args.extend([
        Ptr(at(input(q, 1))),
        I32(icode(pos.dtype)?),
        Ptr(at(input(q, 2))),
        I32(fcode(freq.dtype)?),
        I64(d as i64),
        I64(dv as i64),
        I32(i32::from(interleaved)),
        F32(scale),
        Ptr(at(input(k, 2))),
        I32(icode(wpos.dtype)?),
        I64(cache[2] as i64),
        Ptr(error),
        I32(tag),
    ]);
    if let Some(g) = dense {
        if qk_norms.is_some() {
            return Err(Error::Backend(
                "q, k and v with rope: dense products take no per-head norms".into(),
            ));
        }
        let smem = norm_staging(norm, kx, "q, k and v with rope")?;
        let w = fsuffix(graph.node(first.inputs[1]).dtype)?;
        let name = intern(format!("dsk_gemv3_rope_{}_{w}", fsuffix(x.dtype)?));
        return gpu.launch(name, dsk_blocks(total, g), DSK_THREADS, smem, &args);
    }
    match qk_norms {
        Some(norms) => {
            if scratch == 0 {
                return Err(Error::Backend(
                    "q, k and v with rope and norms: launched without its tickets".into(),
                ));
            }
            args.extend(qk_norm_args(graph, norms, at)?);
            args.push(Ptr(scratch));
        }
        None => args.extend([Ptr(0), Ptr(0), I32(0), F32(0.0), F32(0.0), I32(0), Ptr(0)]),
    }
    let l = tc_gemv_kernel("qgemv", x.dtype, 4, 1, total, kx).ok_or_else(|| no_tensor_cores("q, k and v with rope"))?;
    // With the norms, a head's tiles in one cluster (nn.cu tc_qgemv3_nrope) where the device
    // runs one (Hopper: 8 blocks, heads up to 128 wide; 16, heads 256 wide as Gemma's, where
    // its clusters of that size fit), else tickets.
    let cluster = (d / 16) as u32;
    if qk_norms.is_some() && cluster <= 16 && gpu.clusters() && qk_norm_clusters() {
        let l = GemvLaunch {
            name: intern(l.name.replacen("tc_qgemv_", "tc_qgemv3_nrope_", 1)),
            grid: (total / 16) as u32,
            ..l
        };
        let l = tc_double(gpu, l, kx, true)?;
        if cluster <= 8 || gpu.clusters_fit(l.name, cluster, l.block, l.smem)? {
            return gpu.launch_gemv_clusters(&l, cluster, &args);
        }
    }
    let l = GemvLaunch {
        name: intern(l.name.replacen("tc_qgemv_", "tc_qgemv3_rope_", 1)),
        ..l
    };
    gpu.launch_gemv(&tc_double(gpu, l, kx, false)?, &args)
}

/// `MLXCEL_TC_BLOCKS=N`: at most N blocks for the tensor-core GEMVs whose blocks loop over row
/// tiles (Gpu::launch_gemv), so that small test shapes take several tiles a block; for checks,
/// not speed. The loop-free double-buffered q, k and v launch ([`tc_double`]) is then not taken.
pub(crate) fn tc_block_cap() -> Option<u32> {
    static CAP: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *CAP.get_or_init(|| env_usize("MLXCEL_TC_BLOCKS").filter(|&n| n > 0).map(|n| n as u32))
}

/// The double-buffered form (`_db`: gemv.cu tc_qdot's DB) of the q, k and v products' launch
/// `l` (nn.cu `tc_qgemv3_rope`, `tc_qgemv3_nrope`) over k: each warp keeps two chunks of its
/// weights in flight, the first two requested before x is staged, so with the add + RMSNorm in
/// front (a block-wide sum and two trips to L2) a warp of two chunks a tile has all its weights
/// on their way before the norm. Where blocks are of 256 threads at most (the form's bound),
/// each warp has two chunks or more, and the device holds every block of the launch at once
/// (the form runs a block a tile, no loop). By default only for the launch without per-head
/// norms (`clustered` false; H100, session 26: llama-3.1-8b 361 → 366 tok/s with the early
/// attention, where qwen3-8b's clustered form lost 333 → 307); `MLXCEL_TC_DB_QKV=1` takes it
/// for the clustered launch too, `=0` for neither.
fn tc_double(gpu: &Gpu, l: GemvLaunch, k: usize, clustered: bool) -> Result<GemvLaunch> {
    static MODE: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    let mode = MODE.get_or_init(|| std::env::var("MLXCEL_TC_DB_QKV").ok().map(|v| v == "1"));
    if !mode.unwrap_or(!clustered)
        || tc_block_cap().is_some()
        || l.block > 256
        || k.div_ceil(256) < 2 * (l.block as usize / 32)
    {
        return Ok(l);
    }
    let name = intern(format!("{}_db", l.name.trim_end_matches("_r0")));
    Ok(if l.grid <= gpu.resident_blocks(name, l.block, l.smem)? {
        GemvLaunch { name, ..l }
    } else {
        l
    })
}

/// The arguments of the per-head q and k norms a launch applies (nn.cu `rope_qkv_norm_write`,
/// `tc_qgemv3_rope`, `tc_qgemv3_nrope`): both weights, their dtype, each eps, the unit offset
/// (both norms share it and the weights' dtype: fuse.rs qk_norms).
fn qk_norm_args(graph: &Graph, [nq, nk]: [usize; 2], at: &dyn Fn(usize) -> u64) -> Result<Vec<Arg>> {
    let params = |n: usize| match graph.nodes[n].op {
        Op::RmsNorm { eps, unit_offset } => (eps, unit_offset),
        _ => unreachable!("the folded norms are RMSNorms"),
    };
    let ((q_eps, unit_offset), (k_eps, _)) = (params(nq), params(nk));
    let weight = |n: usize| graph.nodes[n].inputs[1];
    Ok(vec![
        Arg::Ptr(at(weight(nq).index())),
        Arg::Ptr(at(weight(nk).index())),
        Arg::I32(fcode(graph.node(weight(nq)).dtype)?),
        Arg::F32(q_eps),
        Arg::F32(k_eps),
        Arg::I32(i32::from(unit_offset)),
    ])
}

/// Whether q, k and v's products with their per-head norms run a head's tiles in a cluster
/// (`tc_qgemv3_nrope`), where the device has clusters; `MLXCEL_CUDA_QK_NORM_CLUSTER=0` takes
/// the tickets instead (`tc_qgemv3_rope`).
fn qk_norm_clusters() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    switch(&ON, "MLXCEL_CUDA_QK_NORM_CLUSTER", true)
}

/// Warps a block of the loads-first dense GEMVs (gemv.cu's DSK_WARPS, which must agree), and
/// its threads.
const DSK_WARPS: usize = 8;
const DSK_THREADS: u32 = DSK_WARPS as u32 * 32;

/// The warps that split k for each row (G) of the loads-first dense GEMVs (gemv.cu `dsk_*`) for
/// one row of 16-bit x by an [n, k] 16-bit weight, where they take it: the fewest (1, 2, 4 or
/// 8) that hold a row in one batch of 4 words a lane (k ≤ 1024·G), so a row is one memory round
/// trip. Not for the LM head's width (n ≥ 32768 keeps `dgemv`, near the copy bandwidth there)
/// unless `MLXCEL_DENSE_SK=all`; `MLXCEL_DENSE_SK=0` keeps the warp-a-row kernels throughout.
pub(crate) fn dense_split(x: mlxcel_core::DType, rows: usize, n: usize, k: usize) -> Option<usize> {
    use mlxcel_core::DType;
    static MODE: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    let mode = *MODE.get_or_init(|| match std::env::var("MLXCEL_DENSE_SK").as_deref() {
        Ok("0") => None,
        Ok("all") => Some(true),
        _ => Some(false),
    });
    let wide = mode?;
    let fits = rows == 1 && matches!(x, DType::F16 | DType::BF16) && k.is_multiple_of(8) && (wide || n < 32768);
    fits.then(|| k.div_ceil(1024).next_power_of_two().min(DSK_WARPS))
}

/// Blocks of a loads-first dense GEMV over n rows, DSK_WARPS / g rows a block.
fn dsk_blocks(n: usize, g: usize) -> u32 {
    n.div_ceil(DSK_WARPS / g) as u32
}

/// The shared memory of a dense GEMV launch (`what`) that computes its input from `norm`, so
/// stages it (dense_staging); 0 where x is given. An error where x does not fit, which the
/// fusion that found the pattern checked.
fn norm_staging(norm: &Option<super::fuse::NormIn>, k: usize, what: &str) -> Result<u32> {
    match norm {
        Some(_) => dense_staging(k).ok_or_else(|| {
            mlxcel_core::Error::Backend(format!("{what}: fused for a GEMV that stages x, which does not fit"))
        }),
        None => Ok(0),
    }
}

/// The shared memory a dense one-row GEMV stages x [k] in (as f32, with its 16-value sums;
/// gemv.cu, stage_xf), where it fits: k a multiple of 16.
pub(crate) fn dense_staging(k: usize) -> Option<u32> {
    let bytes = (k + k / 16) * 4;
    (k.is_multiple_of(16) && bytes <= MAX_STAGED_BYTES).then(|| bytes.next_multiple_of(16) as u32)
}

/// A fused pattern found for the tensor-core GEMV that the launch could not give it.
fn no_tensor_cores(what: &str) -> mlxcel_core::Error {
    mlxcel_core::Error::Backend(format!(
        "{what}: fused for the tensor-core GEMV, which does not take it"
    ))
}

/// gemv.cu's NORM_IN_PARAMS for a GEMV that stages x: the add + RMSNorm it computes its input
/// from (and the sandwich norm of one operand, NormIn::pre), or nulls (x given).
fn norm_in_args(graph: &Graph, norm: &Option<super::fuse::NormIn>, at: &dyn Fn(usize) -> u64) -> Result<Vec<Arg>> {
    use Arg::{Ptr, F32, I32};
    let Some(n) = norm else {
        return Ok(vec![
            Ptr(0),
            Ptr(0),
            Ptr(0),
            Ptr(0),
            I32(0),
            F32(0.0),
            I32(0),
            Ptr(0),
            I32(0),
            F32(0.0),
            I32(0),
        ]);
    };
    let rms = |j: usize| match graph.nodes[j].op {
        Op::RmsNorm { eps, unit_offset } => (eps, unit_offset),
        _ => unreachable!("NormIn holds norms"),
    };
    let (eps, unit_offset) = rms(n.norm);
    let w = graph.nodes[n.norm].inputs[1];
    // a, b: with a pre-norm, b is its input (NormIn::reads), its weight follows.
    let reads = n.reads(graph);
    let mut args = vec![
        Ptr(at(reads[0].index())),
        Ptr(at(reads[1].index())),
        Ptr(at(n.add)),
        Ptr(at(w.index())),
        I32(fcode(graph.node(w).dtype)?),
        F32(eps),
        I32(i32::from(unit_offset)),
    ];
    match n.pre {
        Some(p) => {
            let (peps, poff) = rms(p);
            let pw = reads[2];
            args.extend([
                Ptr(at(pw.index())),
                I32(fcode(graph.node(pw).dtype)?),
                F32(peps),
                I32(i32::from(poff)),
            ]);
        }
        None => args.extend([Ptr(0), I32(0), F32(0.0), I32(0)]),
    }
    Ok(args)
}

/// rope.cu's leading parameters, shared by `rope` and `rope_kv_write`: x, its dtype, the
/// positions (kind, and whether one row per batch) and the frequencies of rope node `r`, whose
/// k-th input is at `at(k)`.
fn rope_inputs(graph: &Graph, r: usize, at: &dyn Fn(usize) -> u64) -> Result<Vec<Arg>> {
    let node = &graph.nodes[r];
    let (pos, freq) = (graph.node(node.inputs[1]), graph.node(node.inputs[2]));
    Ok(vec![
        Arg::Ptr(at(0)),
        Arg::I32(fcode(node.dtype)?),
        Arg::Ptr(at(1)),
        Arg::I32(icode(pos.dtype)?),
        Arg::I32(i32::from(pos.shape.len() == 2)),
        Arg::Ptr(at(2)),
        Arg::I32(fcode(freq.dtype)?),
    ])
}

/// The trailing parameters of `kv_write` and `rope_kv_write` for cache write `w` of `new`-shaped
/// rows: the write position (at `pos`: kind, count), the cache and row shapes, the error flag.
fn cache_write_place(graph: &Graph, w: usize, new: &[usize], pos: u64, error: u64, tag: i32) -> Result<Vec<Arg>> {
    let cache = &graph.nodes[w].shape;
    let at = graph.node(graph.nodes[w].inputs[2]);
    Ok(vec![
        Arg::Ptr(pos),
        Arg::I32(icode(at.dtype)?),
        Arg::I32(at.shape.iter().product::<usize>() as i32),
        Arg::I64(cache[0] as i64),
        Arg::I64(cache[1] as i64),
        Arg::I64(cache[2] as i64),
        Arg::I64(new[2] as i64),
        Arg::I64(cache[3] as i64),
        Arg::Ptr(error),
        Arg::I32(tag),
    ])
}

/// A product cuBLAS takes: `y [rows, n] = x [rows, k] · Wᵀ` with more rows than the GEMV
/// kernels take, activations and output in a pair of types GemmEx multiplies with f32
/// accumulation. `expand` says the weight is first written into scratch in x's dtype.
struct Gemm {
    rows: usize,
    n: usize,
    k: usize,
    expand: bool,
}

fn gemm_plan(graph: &Graph, i: usize) -> Option<Gemm> {
    use mlxcel_core::DType::{BF16, F16, F32};
    let node = &graph.nodes[i];
    let x = graph.node(*node.inputs.first()?);
    let w = graph.node(*node.inputs.get(1)?);
    let k = *x.shape.last()?;
    let rows = x.shape.iter().product::<usize>() / k.max(1);
    let types_ok = matches!(
        (x.dtype, node.dtype),
        (F32, F32) | (F16, F16) | (F16, F32) | (BF16, BF16) | (BF16, F32)
    );
    if rows <= GEMV_ROWS || !types_ok || k == 0 || qmm_rows_plan(graph, i).is_some() {
        return None;
    }
    match node.op {
        // A weight in another dtype is first converted to x's, which must lose nothing: only
        // widening into f32 x qualifies (an f32 weight under f16 x runs the general kernel).
        Op::MatMul { transpose_b: true }
            if w.shape.len() == 2 && w.dtype.is_float() && (w.dtype == x.dtype || x.dtype == F32) =>
        {
            Some(Gemm {
                rows,
                n: w.shape[0],
                k,
                expand: w.dtype != x.dtype,
            })
        }
        Op::QuantizedMatMul { .. } => Some(Gemm {
            rows,
            n: w.shape[0],
            k,
            expand: true,
        }),
        _ => None,
    }
}

/// Scratch bytes node `i` needs for its expanded weight when it goes to cuBLAS.
pub(crate) fn gemm_scratch_bytes(graph: &Graph, i: usize) -> usize {
    match gemm_plan(graph, i) {
        Some(g) if g.expand => g.n * g.k * graph.node(graph.nodes[i].inputs[0]).dtype.size(),
        _ => 0,
    }
}

fn blas_type(d: mlxcel_core::DType) -> cudarc::cublas::sys::cudaDataType {
    use cudarc::cublas::sys::cudaDataType::{CUDA_R_16BF, CUDA_R_16F, CUDA_R_32F};
    match d {
        mlxcel_core::DType::F16 => CUDA_R_16F,
        mlxcel_core::DType::BF16 => CUDA_R_16BF,
        _ => CUDA_R_32F,
    }
}

/// Runs node `i` through cuBLAS if it is a large product and cuBLAS is there; false otherwise.
fn try_gemm(gpu: &Gpu, graph: &Graph, i: usize, ptr: &dyn Fn(usize) -> u64, out: u64, scratch: u64) -> Result<bool> {
    use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t};
    let (Some((blas, _)), Some(plan)) = (&gpu.blas, gemm_plan(graph, i)) else {
        return Ok(false);
    };
    if plan.expand && scratch == 0 {
        return Ok(false);
    }
    let node = &graph.nodes[i];
    let input = |k: usize| graph.node(node.inputs[k]);
    let xdt = input(0).dtype;
    let (n, k) = (plan.n, plan.k);
    let weight = if !plan.expand {
        ptr(1)
    } else {
        let count = (n * k) as i64;
        match node.op {
            Op::QuantizedMatMul { bits, group_size }
                if matches!(bits, 4 | 8) && group_size.is_power_of_two() && group_size >= 32 =>
            {
                // A warp expands 128 packed words a turn, a block of 256 threads 1024.
                let words = n * k * bits as usize / 32;
                let name = if bits == 4 {
                    "dequant_words_4"
                } else {
                    "dequant_words_8"
                };
                gpu.launch_grid(
                    name,
                    (words.div_ceil(1024).min(1 << 20) as u32, 1),
                    256,
                    0,
                    &[
                        Arg::Ptr(ptr(1)),
                        Arg::Ptr(ptr(2)),
                        Arg::Ptr(ptr(3)),
                        Arg::I32(fcode(input(2).dtype)?),
                        Arg::Ptr(scratch),
                        Arg::I32(fcode(xdt)?),
                        Arg::I64(n as i64),
                        Arg::I64(k as i64),
                        Arg::I32(group_size as i32),
                    ],
                )?
            }
            Op::QuantizedMatMul { bits, group_size } => gpu.launch(
                "dequant_rows",
                blocks(n * k),
                THREADS,
                0,
                &[
                    Arg::Ptr(ptr(1)),
                    Arg::Ptr(ptr(2)),
                    Arg::Ptr(ptr(3)),
                    Arg::I32(fcode(input(2).dtype)?),
                    Arg::Ptr(scratch),
                    Arg::I32(fcode(xdt)?),
                    Arg::I64(n as i64),
                    Arg::I64(k as i64),
                    Arg::I32(bits as i32),
                    Arg::I32(group_size as i32),
                ],
            )?,
            _ => gpu.launch(
                "astype_any",
                blocks(n * k),
                THREADS,
                0,
                &[
                    Arg::I32(acode(input(1).dtype)),
                    Arg::Ptr(ptr(1)),
                    Arg::I32(acode(xdt)),
                    Arg::Ptr(scratch),
                    Arg::I64(count),
                ],
            )?,
        }
        scratch
    };
    let (alpha, beta) = (1.0f32, 0.0f32);
    // Row-major y [rows, n] is column-major yᵀ [n, rows] = W [n, k] · xᵀ: A = W read transposed
    // (column-major [k, n]), B = x (column-major [k, rows]).
    // SAFETY: the pointers name live buffers sized by the planner (weights, activations) or by
    // gemm_scratch_bytes (the expanded weight); alpha/beta are host f32 as COMPUTE_32F wants.
    unsafe {
        cudarc::cublas::result::gemm_ex(
            *blas.handle(),
            cublasOperation_t::CUBLAS_OP_T,
            cublasOperation_t::CUBLAS_OP_N,
            n as i32,
            plan.rows as i32,
            k as i32,
            (&alpha) as *const f32 as *const _,
            weight as *const _,
            blas_type(xdt),
            k as i32,
            ptr(0) as *const _,
            blas_type(xdt),
            k as i32,
            (&beta) as *const f32 as *const _,
            out as *mut _,
            blas_type(node.dtype),
            n as i32,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
        )
    }
    .map_err(|e| Error::Backend(format!("cuBLAS GemmEx ({} x {n} x {k}): {e:?}", plan.rows)))?;
    Ok(true)
}

/// A paged attention's pool: its table's width, the block size and the pool's blocks.
#[derive(Clone, Copy)]
struct Pages {
    width: usize,
    block_size: usize,
    blocks: usize,
}

/// Attention node `i` as its kernels see it: `b` rows of `hq` query heads over `t` queries of
/// `d` channels, `hkv` kv heads of `s` positions a row (a paged row: its table's), values `dv`
/// wide.
struct AttentionShape {
    b: usize,
    hq: usize,
    t: usize,
    d: usize,
    hkv: usize,
    s: usize,
    dv: usize,
    pages: Option<Pages>,
}

fn attention_shape(graph: &Graph, i: usize) -> Option<AttentionShape> {
    let node = &graph.nodes[i];
    if !matches!(node.op, Op::Attention { .. } | Op::PagedAttention { .. }) {
        return None;
    }
    let shape = |k: usize| &graph.node(node.inputs[k]).shape;
    let (sq, sk, sv) = (shape(0), shape(1), shape(2));
    let (hkv, s, dv, pages) = match node.op {
        Op::Attention { .. } => (sk[1], sk[2], sv[3], None),
        Op::PagedAttention { block_size, .. } => {
            let width = shape(4)[1];
            let pages = Pages {
                width,
                block_size,
                blocks: sk[0] / block_size.max(1),
            };
            (sk[1], width * block_size, sv[2], Some(pages))
        }
        _ => return None,
    };
    Some(AttentionShape {
        b: sq[0],
        hq: sq[1],
        t: sq[2],
        d: sq[3],
        hkv,
        s,
        dv,
        pages,
    })
}

/// Splits of the cache for decode attention (one query position per head, head sizes up to 256):
/// a split of 32 keys (eight a warp, so the serial chain of loads per warp stays short), at most
/// 256 splits, and enough blocks for every SM twice over.
fn decode_attention_splits(graph: &Graph, i: usize) -> Option<usize> {
    let a = attention_shape(graph, i)?;
    if a.t != 1 || a.d > 256 || a.dv > 256 {
        return None;
    }
    let by_keys = a.s.div_ceil(keys_per_split().unwrap_or(32));
    if gqa_decode_kernel(graph, i).is_some() {
        // The grouped kernel splits by keys only: each block does a group's work, and more
        // splits (to fill the GPU) measured slower (gemma3-1b: 346 tok/s by keys, 318 aiming at
        // 132 blocks). Many groups (a batched step) fill it with fewer, longer splits: about
        // 1024 blocks, each split at most 512 keys (its scores live in shared memory), so the
        // partials to merge shrink with the splits.
        let fill = 1024usize.div_ceil(a.b * a.hkv).max(a.s.div_ceil(512));
        let splits = if keys_per_split().is_some() {
            by_keys
        } else {
            by_keys.min(fill)
        };
        return Some(splits.min(a.s).clamp(1, 256));
    }
    // The per-head kernel also aims at a block for every SM twice over (`MLXCEL_ATT_FILL=N`: N
    // blocks in all, for tuning).
    static FILL: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let fill = *FILL.get_or_init(|| env_usize("MLXCEL_ATT_FILL").unwrap_or(264).max(1));
    let blocks = a.b * a.hq / lanes_group(graph, i);
    if a.b > 1 && keys_per_split().is_none() {
        // A batched step has blocks enough: about 2048 in all (serve's 64-row step on the 8B
        // preset, H200: 7254.6 and 7218.8 tok/s against 6931.9 and 6931.3 aiming at 4096;
        // `MLXCEL_ATT_BATCH_BLOCKS=N` aims at N, for tuning), splits of up to 512 keys, so
        // that each layer's partials stay near rows · 8 · (dv + 2) floats at long contexts.
        static AIM: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        let aim = *AIM.get_or_init(|| env_usize("MLXCEL_ATT_BATCH_BLOCKS").unwrap_or(2048).max(1));
        let most = aim.div_ceil(blocks).max(a.s.div_ceil(512));
        return Some(by_keys.min(most).min(a.s).clamp(1, 256));
    }
    Some(by_keys.max(fill.div_ceil(blocks)).min(a.s).clamp(1, 256))
}

/// The grouped-query decode attention kernel for node `i`, as its channels a lane, where it
/// applies and the lanes kernel does not (32-bit caches, or `MLXCEL_ATT_LANES=0`): one query
/// position, q, k and v heads alike of 128 or 256 channels, up to 4 query heads a kv head.
/// Elsewhere the per-head kernel measured faster: 64 channels (qwen2.5-0.5b: 748 against 675
/// tok/s) and groups of 8 (qwen3-30b-a3b: 179.0 against 164.5, its per-lane registers for 8
/// heads); and the lanes kernel beats it where both apply (H100, per-head lanes at batch 1:
/// llama-3.1-8b 305.8 against 290.5 tok/s, qwen3-8b 281.8 against 265.8, gemma3-1b 751.3
/// against 696.5; 4 heads a block in serve's 64-row step: 5709 against 5117).
/// `MLXCEL_ATT_GQA=0`: never; `=all`: wherever it applies, as before the lanes kernel.
fn gqa_decode_kernel(graph: &Graph, i: usize) -> Option<usize> {
    static MODE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let mode = MODE.get_or_init(|| std::env::var("MLXCEL_ATT_GQA").unwrap_or_default());
    let lanes = lanes_on() && lanes_shape(graph, i).is_some();
    if mode == "0" || (lanes && mode != "all") {
        return None;
    }
    let a = attention_shape(graph, i)?;
    let group = a.hq / a.hkv.max(1);
    let fits = a.t == 1 && a.dv == a.d && matches!(a.d, 128 | 256);
    (fits && a.hkv > 0 && a.hq % a.hkv == 0 && (1..=4).contains(&group)).then_some(a.d / 32)
}

/// The split kernel of decode attention node `i` that also rotates its queries and writes the
/// new key and value into the caches ([`Fused::RopeAttention`]), where one runs it: a split
/// decode over dense caches, by the per-head kernel or the grouped one (not the online variant).
///
/// [`Fused::RopeAttention`]: super::fuse::Fused::RopeAttention
pub(crate) fn rope_attention_kernel(graph: &Graph, i: usize) -> Option<&'static str> {
    let a = attention_shape(graph, i)?;
    if a.pages.is_some() || decode_attention_splits(graph, i).is_none() || lanes_group(graph, i) > 1 {
        return None;
    }
    match gqa_decode_kernel(graph, i) {
        Some(_) if online_attention() => None,
        Some(4) => Some("attention_gqa_rope_4"),
        Some(_) => Some("attention_gqa_rope_8"),
        None => lanes_attention_kernel(graph, i, "_rope").or(Some("attention_split_rope")),
    }
}

/// The programmatic form of lanes kernel `name` (`attention_lanes_early_{D}`, nn.cu EARLY: a head
/// a block, dense caches), which requests its first round of keys and values but the newest
/// row's (the step's write position, the length's last) before waiting for the q, k and v
/// launch ahead. By default (H100, session 26: llama-3.1-8b 356 → 361 tok/s, qwen3-8b 333 →
/// 339, gemma3-1b 762 → 773, llama-3.2-1b 1331 → 1363; qwen2.5-0.5b within its noise);
/// `MLXCEL_PDL_ATTENTION=0`: the plain lanes kernel.
fn early_attention(name: &str) -> Option<&'static str> {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    switch(&ON, "MLXCEL_PDL_ATTENTION", true)
        .then(|| early_name(name))
        .flatten()
        .map(intern)
}

/// `attention_lanes_early_{D}` for `attention_lanes_{D}`; None for the other lanes kernels.
fn early_name(name: &str) -> Option<String> {
    let d = name.strip_prefix("attention_lanes_")?;
    d.parse::<usize>().is_ok().then(|| format!("attention_lanes_early_{d}"))
}

/// The per-head decode attention with several keys in flight a warp (nn.cu,
/// `attention_lanes{variant}_{D}`: a key every D / 8 lanes, a 16-byte load of it and of its value
/// a lane) for node `i` where it applies: one query position, q, k and v heads of one width D of
/// 32, 64, 128 or 256 channels, 16-bit caches. `variant` is "", "_paged" or "_rope", as for
/// attention_split, which runs elsewhere and with `MLXCEL_ATT_LANES=0` (H100: qwen2.5-0.5b 1067.7
/// against 926.5 tok/s, llama-3.2-1b 1182.9 against 1042.8, qwen3-30b-a3b 304.3 against 274.2).
fn lanes_attention_kernel(graph: &Graph, i: usize, variant: &str) -> Option<&'static str> {
    lanes_on().then(|| lanes_kernel_for(graph, i, variant)).flatten()
}

/// Whether the lanes decode attention runs where it applies (`MLXCEL_ATT_LANES=0`: never).
fn lanes_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    switch(&ON, "MLXCEL_ATT_LANES", true)
}

/// [`lanes_attention_kernel`] with the switch on: the block of 4 query heads where
/// [`lanes_group`] says so.
fn lanes_kernel_for(graph: &Graph, i: usize, variant: &str) -> Option<&'static str> {
    let a = lanes_shape(graph, i)?;
    let group = if variant == "_rope" || lanes_group(graph, i) == 1 {
        ""
    } else {
        "_g4"
    };
    Some(intern(format!("attention_lanes{variant}{group}_{}", a.d)))
}

/// Node `i`'s shape where the lanes kernel takes it: one query position, q, k and v heads of
/// one width of 32, 64, 128 or 256 channels, 16-bit caches.
fn lanes_shape(graph: &Graph, i: usize) -> Option<AttentionShape> {
    use mlxcel_core::DType;
    let a = attention_shape(graph, i)?;
    let node = &graph.nodes[i];
    let kv = graph.node(node.inputs[1]).dtype;
    let fits = a.t == 1 && a.dv == a.d && matches!(a.d, 32 | 64 | 128 | 256) && matches!(kv, DType::F16 | DType::BF16);
    (fits && graph.node(node.inputs[2]).dtype == kv).then_some(a)
}

/// Query heads a block of the lanes decode attention takes for node `i`: 4 in a batched step
/// where [`group_of_four`] finds them, so the block loads each key and value once for all 4
/// (`attention_lanes_g4_*`; H100, serve's 64-row step on the 8B preset: 5709 tok/s against 5117
/// with the grouped `attention_gqa_paged_4` and 4926 with a head a block), else 1. At one row a
/// head a block wins, having 4 times the blocks (llama-3.1-8b: 305.8 against 291.7 tok/s).
/// `MLXCEL_ATT_LANES_GROUP=0`: never 4; `=1`: also at one row.
fn lanes_group(graph: &Graph, i: usize) -> usize {
    static MODE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let mode = MODE.get_or_init(|| std::env::var("MLXCEL_ATT_LANES_GROUP").unwrap_or_default());
    let batched = attention_shape(graph, i).is_some_and(|a| a.b > 1);
    match mode.as_str() {
        _ if !lanes_on() => 1,
        "0" => 1,
        "1" => group_of_four(graph, i),
        _ if batched => group_of_four(graph, i),
        _ => 1,
    }
}

/// 4 where node `i` is a decode attention the lanes kernel takes with a multiple of 4 query
/// heads a kv head, else 1.
fn group_of_four(graph: &Graph, i: usize) -> usize {
    match lanes_shape(graph, i) {
        Some(a) if a.hkv > 0 && a.hq % a.hkv == 0 && (a.hq / a.hkv) % 4 == 0 => 4,
        _ => 1,
    }
}

/// Whether a decode attention's split kernel merges its partials itself (the last block of a
/// row group to finish combines them; nn.cu, splits_done) rather than leaving them to a second
/// launch, attention_combine: the per-head kernel does (H100: smollm2-135m 871.7 against 863.0
/// tok/s, llama-3.2-1b 967.6 against 955.0), the grouped one does not (llama-3.1-8b 275.8
/// against 283.3: its few long blocks end in the merge). `MLXCEL_ATT_MERGE=0`: neither;
/// `MLXCEL_ATT_MERGE=all`: both.
fn split_merge(grouped: bool) -> bool {
    static MODE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let mode = MODE.get_or_init(|| std::env::var("MLXCEL_ATT_MERGE").unwrap_or_default());
    match mode.as_str() {
        "0" => false,
        "all" => true,
        _ => !grouped,
    }
}

/// `MLXCEL_ATT_ONLINE=1`: grouped decode attention with each warp's keys and values requested
/// together and an online softmax (nn.cu, attention_gqa_online), instead of scores, then
/// values. Off by default until measured on the GPU.
fn online_attention() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    switch(&ON, "MLXCEL_ATT_ONLINE", false)
}

/// The routed product grouped by expert (grouped.cu) for node `i`, where it applies, and the
/// weight rows a block takes: more pairs than the decode kernels take, 4-bit weights, f16/bf16
/// x, k a multiple of 64, at most 1024 experts. `grouped_rows` (qmm_rows's blocks, tiles of 32
/// pairs) where n is a multiple of 16, k of 128, groups of 32, 64 or 128 and scales and biases
/// share a dtype, else `grouped_qmm`. For comparison: `MLXCEL_MOE_GROUPED=0` gather_qmm, a weight
/// read a pair; `MLXCEL_MOE_ROWS=0` always grouped_qmm; `MLXCEL_MOE_ROWS=8` or `=2` grouped_rows
/// with tiles of 64 or 16 pairs. On the H100, qwen3-30b-a3b-4bit's prefill of 512 tokens: tiles
/// of 32 14053 tok/s, of 64 12946, grouped_qmm 11582 (a block an expert before: 8280).
fn grouped_qmm_kernel(graph: &Graph, i: usize) -> Option<Grouped> {
    use mlxcel_core::DType::{BF16, F16};
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    static ROWS: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    if !switch(&ON, "MLXCEL_MOE_GROUPED", true) {
        return None;
    }
    let node = &graph.nodes[i];
    let Op::GatherQuantizedMatMul { bits: 4, group_size } = node.op else {
        return None;
    };
    let (x, w) = (graph.node(node.inputs[0]), graph.node(node.inputs[1]));
    let pairs: usize = graph.node(node.inputs[4]).shape.iter().product();
    let k = *x.shape.last()?;
    let fits = pairs > GATHER_GEMV_PAIRS && pairs < i32::MAX as usize && w.shape[0] <= 1024;
    let shape_fits = k.is_multiple_of(64) && group_size.is_multiple_of(8) && k.is_multiple_of(group_size);
    if !(fits && shape_fits && matches!(x.dtype, F16 | BF16)) {
        return None;
    }
    let n = *w.shape.get(1)?;
    let rows = n.is_multiple_of(16)
        && k.is_multiple_of(128)
        && matches!(group_size, 32 | 64 | 128)
        && graph.node(node.inputs[2]).dtype == graph.node(node.inputs[3]).dtype;
    let mode = ROWS.get_or_init(|| std::env::var("MLXCEL_MOE_ROWS").ok());
    let dt = if x.dtype == F16 { "f16" } else { "bf16" };
    let (name, rows, pairs) = match (rows, mode.as_deref()) {
        (false, _) | (true, Some("0")) => (format!("grouped_qmm_{dt}"), 64, 64),
        (true, Some("8")) => (format!("grouped_rows_{dt}_8"), QR_ROWS, 64),
        (true, Some("2")) => (format!("grouped_rows_{dt}_2"), QR_ROWS, 16),
        (true, _) => (format!("grouped_rows_{dt}_4"), QR_ROWS, 32),
    };
    Some(Grouped {
        name: intern(name),
        rows,
        pairs,
    })
}

/// A grouped routed product's kernel and its blocks: `rows` weight rows by a tile of at most
/// `pairs` of one expert's (token, slot) pairs.
#[derive(Debug, PartialEq)]
struct Grouped {
    name: &'static str,
    rows: usize,
    pairs: usize,
}

impl Grouped {
    /// The most tiles `pairs` pairs over `experts` experts can make: each expert's last tile may
    /// be partial.
    fn max_tiles(&self, pairs: usize, experts: usize) -> usize {
        pairs.div_ceil(self.pairs) + experts.min(pairs)
    }
}

/// Launches qmm_rows for node `i` as planned in `q`, and with several splits the sum of their
/// partials (in `scratch`).
fn qmm_rows(
    gpu: &Gpu,
    graph: &Graph,
    i: usize,
    q: &QmmRows,
    ptr: &dyn Fn(usize) -> u64,
    out: u64,
    scratch: u64,
) -> Result<()> {
    use Arg::{Ptr, I32, I64};
    let node = &graph.nodes[i];
    let scale_dtype = graph.node(node.inputs[2]).dtype;
    // A few rows (a batched decode step): every weight read once for all of them.
    let part = q.partials(scratch, "product")?;
    let args = [
        Ptr(ptr(0)),
        Ptr(ptr(1)),
        Ptr(ptr(2)),
        Ptr(ptr(3)),
        I32(fcode(scale_dtype)?),
        Ptr(out),
        I32(fcode(node.dtype)?),
        Ptr(part),
        I64(q.rows as i64),
        I64(q.n as i64),
        I64(q.k as i64),
        I32(q.group as i32),
        I64(q.per_split as i64),
    ];
    gpu.launch_grid(q.name, q.grid(), 128, q.smem, &args)?;
    if q.splits == 1 {
        return Ok(());
    }
    let count = q.rows * q.n;
    let sum = [
        Ptr(scratch),
        I64(q.splits as i64),
        I64(count as i64),
        Ptr(out),
        I32(fcode(node.dtype)?),
    ];
    gpu.launch("qmm_rows_sum", blocks(count), THREADS, 0, &sum)
}

/// Launches qmm_ring_glu as planned in `q` for a GLU's gate and up (`mats`: each one's words,
/// scales and biases nodes) into `out`: act(x·Gᵀ) · (x·Uᵀ) with `codes` (output dtype, product
/// dtype, activation) as the GLU kernels take them; with several splits, the partials (in
/// `scratch`) and qmm_rows_sum_glu.
#[allow(clippy::too_many_arguments)]
fn qmm_glu(
    gpu: &Gpu,
    graph: &Graph,
    q: &QmmRows,
    mats: [[usize; 3]; 2],
    at: &dyn Fn(usize) -> u64,
    codes: [Arg; 3],
    x: usize,
    out: u64,
    scratch: u64,
) -> Result<()> {
    use Arg::{Ptr, I32, I64};
    let part = q.partials(scratch, "GLU")?;
    let mut args = vec![Ptr(at(x))];
    for m in mats {
        args.extend(m.map(|j| Ptr(at(j))));
    }
    args.push(I32(fcode(graph.nodes[mats[0][1]].dtype)?));
    args.push(Ptr(out));
    args.extend(codes.iter().cloned());
    args.extend([
        Ptr(part),
        I64(q.rows as i64),
        I64(q.n as i64),
        I64(q.k as i64),
        I32(q.group as i32),
        I64(q.per_split as i64),
    ]);
    gpu.launch_grid(q.name, q.grid(), 128, q.smem, &args)?;
    if q.splits == 1 {
        return Ok(());
    }
    let count = q.rows * q.n;
    let mut sum = vec![
        Ptr(scratch),
        I64(q.splits as i64),
        I64(q.rows as i64),
        I64(q.n as i64),
        Ptr(out),
    ];
    sum.extend(codes);
    gpu.launch("qmm_rows_sum_glu", blocks(count), THREADS, 0, &sum)
}

/// Launches qmm_ring3 as planned in `q` for up to three products of one x. `args` are x's and
/// each product slot's (words, scales, biases, output, rows; zeros for an unused slot) as the
/// fused products' launches take them, `codes` the scales' and outputs' dtype codes, `biases`
/// each slot's bias vector (0: none). With several splits, the partials (in `scratch`) and
/// qmm_rows_sum3, which adds the biases.
fn qmm_products(gpu: &Gpu, q: &QmmRows, args: Vec<Arg>, codes: [Arg; 2], biases: Vec<Arg>, scratch: u64) -> Result<()> {
    use Arg::{Ptr, I32, I64};
    // Slot s's output and rows (after x and the slots before it, five arguments each).
    let slot = |s: usize| [args[4 + 5 * s].clone(), args[5 + 5 * s].clone()];
    let part = q.partials(scratch, "fused products")?;
    let mut launch = args.clone();
    launch.extend(codes.iter().cloned());
    launch.extend(biases.iter().cloned());
    launch.extend([
        Ptr(part),
        I64(q.rows as i64),
        I64(q.k as i64),
        I32(q.group as i32),
        I64(q.per_split as i64),
    ]);
    gpu.launch_grid(q.name, q.grid(), 128, q.smem, &launch)?;
    if q.splits == 1 {
        return Ok(());
    }
    let mut sum = vec![Ptr(scratch), I64(q.splits as i64), I64(q.rows as i64)];
    sum.extend((0..3).flat_map(slot));
    sum.push(codes[1].clone());
    sum.extend(biases);
    gpu.launch("qmm_rows_sum3", blocks(q.rows * q.n), THREADS, 0, &sum)
}

/// Weight rows a qmm_rows block takes (gemv.cu, QR_ROWS).
const QR_ROWS: usize = 128;

/// A product qmm_rows (gemv.cu) takes, and its launch.
pub(crate) struct QmmRows {
    name: &'static str,
    /// Dynamic shared memory of the launch (the ring kernel's; 0 for qmm_rows).
    smem: u32,
    rows: usize,
    n: usize,
    k: usize,
    group: usize,
    /// Blocks a split (along the grid's x: the weight rows' blocks).
    blocks: usize,
    /// Splits of k (blocks along the grid's y), each of `per_split` 128-value chunks.
    splits: usize,
    per_split: usize,
}

impl QmmRows {
    /// Where the launch's split partials go: `scratch`, or null (0) without splits. An error
    /// where `what` was planned with splits but got no scratch.
    fn partials(&self, scratch: u64, what: &str) -> Result<u64> {
        match (self.splits > 1, scratch) {
            (false, _) => Ok(0),
            (true, 0) => Err(Error::Backend(format!(
                "a split {what} launch was planned without its scratch"
            ))),
            (true, p) => Ok(p),
        }
    }

    /// A launch of `blocks` blocks a split (row blocks) of `name`, `per_sm` of which fit an SM:
    /// k split as many ways as keep the grid within one wave of the 132 SMs of an H200 (a
    /// second, part-full wave would cost as much as the first), at most 8 (each split's partials
    /// are a rows x n f32 array to add).
    fn split(
        name: &'static str,
        smem: u32,
        (rows, n, k): (usize, usize, usize),
        group: usize,
        blocks: usize,
        per_sm: usize,
    ) -> QmmRows {
        let chunks = k / 128;
        let wanted = (132 * per_sm / blocks).clamp(1, 8).min(chunks);
        let per_split = chunks.div_ceil(wanted);
        QmmRows {
            name,
            smem,
            rows,
            n,
            k,
            group,
            blocks,
            splits: chunks.div_ceil(per_split),
            per_split,
        }
    }

    /// The launch's grid: the row blocks by the splits.
    fn grid(&self) -> (u32, u32) {
        (self.blocks as u32, self.splits as u32)
    }

    /// Bytes of split partials the launch needs, `width` f32 values a row of x (n, or 2n for
    /// a GLU's gate and up): none without splits.
    fn scratch_bytes(&self, width: usize) -> usize {
        if self.splits > 1 {
            self.splits * self.rows * width * 4
        } else {
            0
        }
    }
}

/// The qmm_rows kernel for `rows` rows of x (`dtype`) by an n x k 4-bit weight, where it applies:
/// 2 to 64 rows (a batched decode step) of f16/bf16 x, n a multiple of 16, k of 128, groups of
/// a multiple of 32 that divide k. `MLXCEL_SMALL_BATCH_TC=0` keeps the 8-row CUDA-core GEMV and
/// cuBLAS after expanding the weight, for comparison.
pub(crate) fn qmm_rows_kernel(
    dtype: mlxcel_core::DType,
    bits: u32,
    group: usize,
    rows: usize,
    n: usize,
    k: usize,
) -> Option<&'static str> {
    use mlxcel_core::DType;
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let fits = bits == 4
        && (2..=64).contains(&rows)
        && n.is_multiple_of(16)
        && k.is_multiple_of(128)
        && group.is_multiple_of(32)
        && k.is_multiple_of(group);
    if !fits || !switch(&ON, "MLXCEL_SMALL_BATCH_TC", true) {
        return None;
    }
    let f16 = match dtype {
        DType::F16 => true,
        DType::BF16 => false,
        _ => return None,
    };
    // Tiles of 8 rows of x: 1, 2, 4 or 8 of them; `MLXCEL_QMM_AHEAD=0` stages x only when each
    // chunk is reached (the `_s` variant, for comparison).
    static AHEAD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let tiles = rows.div_ceil(8).next_power_of_two();
    let name = format!(
        "qmm_rows_{}_{tiles}{}",
        if f16 { "f16" } else { "bf16" },
        if switch(&AHEAD, "MLXCEL_QMM_AHEAD", true) {
            ""
        } else {
            "_s"
        }
    );
    Some(intern(name))
}

/// A quantized product's shape as the batched kernels see it: x [rows, k] by an
/// n x k weight, scales (and biases, the same dtype) in `scales`.
struct QmmShape<'a> {
    x: &'a mlxcel_core::Node,
    scales: mlxcel_core::DType,
    bits: u32,
    group_size: usize,
    rows: usize,
    n: usize,
    k: usize,
}

/// Node `i`'s QmmShape, where it is a quantized product whose scales and biases share a dtype.
fn qmm_shape(graph: &Graph, i: usize) -> Option<QmmShape<'_>> {
    let node = &graph.nodes[i];
    let Op::QuantizedMatMul { bits, group_size } = node.op else {
        return None;
    };
    let (x, w) = (graph.node(node.inputs[0]), graph.node(node.inputs[1]));
    let k = *x.shape.last()?;
    let scales = graph.node(node.inputs[2]).dtype;
    (scales == graph.node(node.inputs[3]).dtype).then_some(QmmShape {
        x,
        scales,
        bits,
        group_size,
        rows: x.shape.iter().product::<usize>() / k.max(1),
        n: *w.shape.first()?,
        k,
    })
}

/// Node `i` as qmm_rows takes it: k split so that the grid fills one wave (two blocks an SM of
/// the 132 of an H200; three for the ring kernel), at most 8 ways (each split's partials are a
/// rows x n f32 array to add).
pub(crate) fn qmm_rows_plan(graph: &Graph, i: usize) -> Option<QmmRows> {
    let QmmShape {
        x,
        scales,
        bits,
        group_size,
        rows,
        n,
        k,
    } = qmm_shape(graph, i)?;
    let name = qmm_rows_kernel(x.dtype, bits, group_size, rows, n, k)?;
    let ring = qmm_ring_smem(x.dtype, scales, group_size, rows).filter(|_| qmm_ring_on());
    let (name, smem, per_sm) = match ring {
        Some(smem) => (ring_name("qmm_ring", x.dtype, rows), smem, 3),
        None => (name, 0, 2),
    };
    Some(QmmRows::split(
        name,
        smem,
        (rows, n, k),
        group_size,
        n.div_ceil(QR_ROWS),
        per_sm,
    ))
}

/// The ring kernel `family` (qmm_ring, qmm_ring_glu or qmm_ring3) for `rows` rows of x in `x`:
/// its count of 8-row tiles (ring_tiles) in the name.
fn ring_name(family: &str, x: mlxcel_core::DType, rows: usize) -> &'static str {
    let x = if x == mlxcel_core::DType::F16 { "f16" } else { "bf16" };
    intern(format!("{family}_{x}_{}", ring_tiles(rows)))
}

/// The 8-row tiles of x a ring kernel takes for `rows` rows: 1, 2, 4 or 8 (a batched step's rows
/// are a power of two; other counts compute zero tiles up to the next).
fn ring_tiles(rows: usize) -> usize {
    rows.div_ceil(8).next_power_of_two()
}

/// Whether batched steps take qmm_ring and qmm_ring_glu where they apply (`MLXCEL_QMM_RING=0`:
/// qmm_rows, one chunk of weights a warp in registers, and two products for a GLU).
pub(crate) fn qmm_ring_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    switch(&ON, "MLXCEL_QMM_RING", QMM_RING_DEFAULT)
}

/// qmm_ring's default (see qmm_ring_on). On an H100 (session 17) the op cases and parity passed
/// with it, and llama-3.1-8b's batched step took 9.72 ms at 64 rows against qmm_rows' 11.29, and
/// 6.96 against 7.40 at 32.
const QMM_RING_DEFAULT: bool = true;

/// Stages of each warp's ring in qmm_ring (gemv.cu, QR_RING_STAGES).
const QR_RING_STAGES: usize = 3;

/// The dynamic shared memory of qmm_ring (gemv.cu) for `rows` rows of x, where the ring kernel
/// takes a product qmm_rows would: scales and biases in x's dtype, groups of 32 or 64.
fn qmm_ring_smem(x: mlxcel_core::DType, scales: mlxcel_core::DType, group: usize, rows: usize) -> Option<u32> {
    if x != scales || !matches!(group, 32 | 64) {
        return None;
    }
    const QR_STRIDE: usize = 20; // gemv.cu: a staged row of x, in 16-byte words
    let tiles = ring_tiles(rows);
    let x_bytes = 8 * tiles * (QR_STRIDE + 16) * 16;
    let stage = 2048 + 2 * 64 * (128 / group); // weights, then scales and biases of 32 rows
    Some((x_bytes + 4 * QR_RING_STAGES * stage) as u32)
}

/// Scratch node `i` needs while it runs, which every node of a graph shares (one runs at a
/// time): qmm_rows's split partials (or, for a GLU anchored at `i`, qmm_ring_glu's), or (with
/// cuBLAS) the weight expanded for GemmEx.
pub(crate) fn shared_scratch_bytes(graph: &Graph, i: usize, blas: bool, fusion: &super::fuse::Fusion) -> usize {
    match &fusion.anchored[i] {
        Some(super::fuse::Fused::Glu { g, .. }) => {
            return qmm_glu_plan(graph, *g).map_or(0, |q| q.scratch_bytes(2 * q.n));
        }
        Some(super::fuse::Fused::Products { parts, norm: None, .. }) => {
            if let Some(q) = qmm_products_plan(graph, parts) {
                return q.scratch_bytes(q.n);
            }
        }
        _ => {}
    }
    match qmm_rows_plan(graph, i) {
        Some(q) => q.scratch_bytes(q.n),
        None if blas => gemm_scratch_bytes(graph, i),
        None => 0,
    }
}

/// Gate product `g` (of a GLU whose up has its shape) as qmm_ring_glu takes it, where
/// `MLXCEL_QMM_GLU=1` asks for it: 2 to 32 rows, 4-bit weights with scales in x's dtype, groups
/// of 32 or 64; blocks of 64 rows of both weights, k split as qmm_rows_plan splits it for the
/// ring. Off by default: on an H100 (session 17) llama-3.1-8b's batched step ran as fast or
/// faster with gate and up as two qmm_ring launches and act · mul as its own (8 rows: 4.57 ms
/// against 4.58; 32 rows: 6.50 against 6.64).
pub(crate) fn qmm_glu_plan(graph: &Graph, g: usize) -> Option<QmmRows> {
    let QmmShape {
        x,
        scales,
        bits,
        group_size,
        rows,
        n,
        k,
    } = qmm_shape(graph, g)?;
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if !switch(&ON, "MLXCEL_QMM_GLU", false) {
        return None;
    }
    qmm_rows_kernel(x.dtype, bits, group_size, rows, n, k)?;
    let smem = qmm_ring_smem(x.dtype, scales, group_size, rows).filter(|_| qmm_ring_on())?;
    // At 8 tiles of x the GLU kernel fits two blocks an SM (gemv.cu, QR_GLU_BLOCKS), and
    // llama-3.1-8b's 64-row step ran 10.22 ms with it against 9.72 with gate and up as two
    // qmm_ring launches (H100, session 17): it takes up to 4 tiles (32 rows), three blocks an SM.
    if ring_tiles(rows) >= 8 {
        return None;
    }
    let per_sm = 3;
    let name = ring_name("qmm_ring_glu", x.dtype, rows);
    Some(QmmRows::split(
        name,
        smem,
        (rows, n, k),
        group_size,
        n.div_ceil(64),
        per_sm,
    ))
}

/// Products `parts` (up to three of one x and one op, each scales and biases of one dtype: a
/// batched step's q, k and v) as qmm_ring3 takes them in one launch: where each alone would
/// take qmm_ring (2 to 64 rows; see qmm_rows_plan), each its own blocks of 128 rows, k split as
/// qmm_rows_plan splits it. `MLXCEL_QMM_QKV=0` leaves them as separate launches, for comparison.
pub(crate) fn qmm_products_plan(graph: &Graph, parts: &[usize]) -> Option<QmmRows> {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if !(1..=3).contains(&parts.len()) || !qmm_ring_on() || !switch(&ON, "MLXCEL_QMM_QKV", true) {
        return None;
    }
    let shapes = parts.iter().map(|&p| qmm_shape(graph, p)).collect::<Option<Vec<_>>>()?;
    for q in &shapes {
        qmm_rows_kernel(q.x.dtype, q.bits, q.group_size, q.rows, q.n, q.k)?;
    }
    let QmmShape {
        x,
        scales,
        group_size,
        rows,
        k,
        ..
    } = shapes[0];
    let smem = qmm_ring_smem(x.dtype, scales, group_size, rows)?;
    Some(QmmRows::split(
        ring_name("qmm_ring3", x.dtype, rows),
        smem,
        (rows, shapes.iter().map(|q| q.n).sum(), k),
        group_size,
        shapes.iter().map(|q| q.n.div_ceil(QR_ROWS)).sum(),
        3,
    ))
}

/// The tensor-core prefill attention (attention.cu) for node `i`, where it applies: more than
/// one query a head, q, k and v of one 16-bit dtype, head sizes 64 or 128 alike
/// (`MLXCEL_ATT_FLASH=0`: the scalar kernel everywhere, for comparison).
pub(crate) fn flash_prefill_kernel(graph: &Graph, i: usize) -> Option<&'static str> {
    use mlxcel_core::DType;
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if !switch(&ON, "MLXCEL_ATT_FLASH", true) {
        return None;
    }
    let node = &graph.nodes[i];
    let Op::Attention { .. } = node.op else { return None };
    let (q, k, v) = (
        graph.node(node.inputs[0]),
        graph.node(node.inputs[1]),
        graph.node(node.inputs[2]),
    );
    let d = q.shape[3];
    let same = q.dtype == k.dtype && k.dtype == v.dtype && k.shape[3] == d && v.shape[3] == d;
    let grouped = k.shape[1] > 0 && q.shape[1] % k.shape[1] == 0;
    if q.shape[2] < 2 || !same || !grouped {
        return None;
    }
    Some(match (q.dtype, d) {
        (DType::F16, 64) => "flash_prefill_f16_64",
        (DType::F16, 128) => "flash_prefill_f16_128",
        (DType::BF16, 64) => "flash_prefill_bf16_64",
        (DType::BF16, 128) => "flash_prefill_bf16_128",
        _ => return None,
    })
}

/// `MLXCEL_ATT_KEYS`: cache positions every decode-attention split takes, batched or not (for
/// tuning). Unset, a split takes 32 (the best of 8/16/32/64 on llama-3.1-8b-4bit at context
/// ~576), and the grouped kernel takes longer ones in a batched step.
fn keys_per_split() -> Option<usize> {
    static K: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *K.get_or_init(|| env_usize("MLXCEL_ATT_KEYS").filter(|&k| k >= 4))
}

/// Rows and the blocks a row of argmax node `i` is split over, where its rows are long (the LM
/// head's logits: one block a row would leave all but one SM idle); 2048 values a block, at most
/// 128 blocks.
fn argmax_parts(graph: &Graph, i: usize) -> Option<(usize, usize)> {
    let node = &graph.nodes[i];
    let Op::Reduce {
        op: ReduceOp::ArgMax,
        axis,
        ..
    } = node.op
    else {
        return None;
    };
    let (rows, len, inner) = dims(&graph.node(node.inputs[0]).shape, axis);
    (inner == 1 && len >= 8192 && len < u32::MAX as usize).then(|| (rows, (len / 2048).clamp(2, 128)))
}

/// Bytes of scratch the fused launch anchored at a node keeps: the tickets of q, k and v's
/// products with their rope and per-head norms (a zeroed count a q and k head, which the
/// launch leaves at zero; nn.cu `tc_qgemv3_rope`).
pub(crate) fn fused_scratch(graph: &Graph, fused: &super::fuse::Fused) -> Option<usize> {
    let super::fuse::Fused::Products {
        rope: Some([q, k, _]),
        qk_norms: Some(_),
        ..
    } = fused
    else {
        return None;
    };
    let heads = graph.nodes[*q].shape[1] + graph.nodes[*k].shape[1];
    Some(heads * 4)
}

/// Bytes of scratch node `i` keeps for partial results: decode attention's splits, a long
/// argmax's per-block maxima (a value and an index each), or a grouped routed product's pair
/// order and expert offsets.
pub(crate) fn partials_scratch(graph: &Graph, i: usize) -> Option<usize> {
    if let Some((rows, parts)) = argmax_parts(graph, i) {
        return Some(rows * parts * 8);
    }
    if let Some(g) = grouped_qmm_kernel(graph, i) {
        // The pairs' order, the experts' offsets, and the tiles' count and (expert, first pair).
        let node = &graph.nodes[i];
        let pairs: usize = graph.node(node.inputs[4]).shape.iter().product();
        let experts = graph.node(node.inputs[1]).shape[0];
        return Some((pairs + experts + 1 + 1 + 2 * g.max_tiles(pairs, experts)) * 4);
    }
    let splits = decode_attention_splits(graph, i)?;
    let a = attention_shape(graph, i)?;
    // The partials (max, sum and output of each split of each query row), then a ticket a row
    // (zeroed here; the split kernels leave them at zero).
    Some(a.b * a.hq * (splits * (a.dv + 2) + 1) * 4)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlxcel_core::{DType, GraphBuilder};

    /// The early (programmatic) attention is the one-head-a-block dense lanes kernel's, and
    /// nn.cu's ATTENTION_LANES defines one for every width.
    #[test]
    fn only_the_dense_one_head_lanes_attention_has_an_early_form() {
        for d in [32, 64, 128, 256] {
            let early = early_name(&format!("attention_lanes_{d}")).unwrap();
            assert_eq!(early, format!("attention_lanes_early_{d}"));
            assert!(
                crate::kernel_source().contains(&format!("ATTENTION_LANES({d})")),
                "{early}"
            );
        }
        assert!(crate::kernel_source().contains("attention_lanes_early_##D("));
        for other in [
            "attention_lanes_g4_128",
            "attention_lanes_paged_128",
            "attention_lanes_rope_64",
            "attention_split",
        ] {
            assert_eq!(early_name(other), None, "{other}");
        }
    }

    /// The routed GLU's warps: halved where that makes one round of blocks of two chunks a warp.
    #[test]
    fn routed_blocks_take_one_round_where_half_the_warps_allow() {
        // qwen3-30b-a3b's GLU on an H100: 2 blocks of 8 warps an SM, 5 of 4 (96 registers).
        let h100 = |w: u32| Ok(132 * if w == 8 { 2 } else { 5 });
        assert_eq!(one_round_warps(8, 8, 384, h100).unwrap(), 4);
        // Already one round, or too many blocks for one round either way (a batched step).
        assert_eq!(one_round_warps(8, 8, 200, h100).unwrap(), 8);
        assert_eq!(one_round_warps(8, 8, 3072, h100).unwrap(), 8);
        // Halving would give a warp four chunks; two warps are the fewest.
        assert_eq!(one_round_warps(8, 16, 384, h100).unwrap(), 8);
        assert_eq!(one_round_warps(2, 3, 5000, h100).unwrap(), 2);
        // The driver's error is the launch's.
        let failing = |_: u32| Err(mlxcel_core::Error::Backend("no occupancy".into()));
        assert!(one_round_warps(8, 8, 384, failing).is_err());
    }

    /// Decode attention over dense caches and over a paged pool, between nodes of other ops.
    fn decode_graph() -> Graph {
        let mut b = GraphBuilder::default();
        let q = b.input("q", DType::F16, &[2, 8, 1, 128]);
        let len = b.input("len", DType::I32, &[2]);
        let k = b.state("k", DType::F16, &[2, 2, 64, 128]);
        let dense = b.attention(q, k, k, len, 0.1, true, None, None).unwrap();
        let pool = b.state("pool", DType::F16, &[96, 2, 128]);
        let table = b.input("table", DType::I32, &[2, 3]);
        let paged = b
            .paged_attention(q, pool, pool, len, table, 16, 0.1, true, None, None)
            .unwrap();
        let sum = b.add(dense, paged).unwrap();
        b.finish(&[sum])
    }

    #[test]
    fn attention_planning_reads_both_layouts_and_ignores_other_nodes() {
        let g = decode_graph();
        let at = |op: &str| g.nodes.iter().position(|n| n.op.name() == op).unwrap();
        // Every node is asked (the planner does); only the two attentions answer.
        let answered: Vec<usize> = (0..g.nodes.len())
            .filter(|&i| partials_scratch(&g, i).is_some())
            .collect();
        assert_eq!(answered, [at("attention"), at("paged_attention")]);
        let (dense, paged) = (
            attention_shape(&g, at("attention")).unwrap(),
            attention_shape(&g, at("paged_attention")).unwrap(),
        );
        assert_eq!((dense.hkv, dense.s, dense.dv), (2, 64, 128));
        assert!(dense.pages.is_none());
        // A paged row holds its table's width of blocks: 3 · 16 positions, of 96 / 16 blocks.
        assert_eq!((paged.hkv, paged.s, paged.dv), (2, 48, 128));
        let p = paged.pages.unwrap();
        assert_eq!((p.width, p.block_size, p.blocks), (3, 16, 6));
        // Groups of 4 heads of 128 in 16-bit caches, two rows: the lanes kernel, 4 heads a
        // block, for both, not the grouped one.
        assert_eq!(gqa_decode_kernel(&g, at("attention")), None);
        assert_eq!(
            lanes_attention_kernel(&g, at("attention"), ""),
            Some("attention_lanes_g4_128")
        );
        assert_eq!(
            lanes_attention_kernel(&g, at("paged_attention"), "_paged"),
            Some("attention_lanes_paged_g4_128")
        );
        assert!(flash_prefill_kernel(&g, at("paged_attention")).is_none());
    }

    #[test]
    fn batched_steps_split_the_cache_less() {
        // (rows, positions, splits): one row keeps 32 keys a split; 64 rows of 32 heads in
        // blocks of 4 (512 blocks) take 4 splits for about 2048 blocks, and long caches splits
        // of 512 keys.
        for (rows, positions, want) in [(1usize, 600usize, 19usize), (8, 272, 9), (64, 272, 4), (64, 4096, 8)] {
            let mut b = GraphBuilder::default();
            let q = b.input("q", DType::F16, &[rows, 32, 1, 128]);
            let len = b.input("len", DType::I32, &[rows]);
            let k = b.state("k", DType::F16, &[rows, 8, positions, 128]);
            let y = b.attention(q, k, k, len, 0.1, true, None, None).unwrap();
            let g = b.finish(&[y]);
            let i = g.nodes.iter().position(|n| n.op.name() == "attention").unwrap();
            assert_eq!(decode_attention_splits(&g, i), Some(want), "{rows} rows of {positions}");
        }
    }

    #[test]
    fn the_lanes_kernel_takes_one_16_bit_head_width_at_decode() {
        // (cache dtype, q/k width, v width, positions of queries): the kernel's name or none.
        let cases = [
            (DType::F16, 64, 64, 1, Some("attention_lanes_64")),
            (DType::BF16, 256, 256, 1, Some("attention_lanes_256")),
            (DType::F16, 32, 32, 1, Some("attention_lanes_32")),
            (DType::F32, 64, 64, 1, None),
            (DType::F16, 96, 96, 1, None),
            (DType::F16, 128, 64, 1, None),
            (DType::F16, 64, 64, 5, None),
        ];
        for (dt, d, dv, t, want) in cases {
            let (g, i) = one_row_attention(dt, (8, 1), (d, dv), t);
            assert_eq!(lanes_kernel_for(&g, i, ""), want, "{dt} {d}/{dv} t={t}");
        }
    }

    #[test]
    fn blocks_of_four_query_heads_need_a_group_of_a_multiple_of_four() {
        // (query heads, kv heads, cache dtype): heads a block.
        let cases = [
            (32, 8, DType::F16, 4),
            (32, 4, DType::BF16, 4),
            (14, 2, DType::F16, 1),
            (8, 8, DType::F16, 1),
            (32, 8, DType::F32, 1),
        ];
        for (hq, hkv, dt, want) in cases {
            let (g, i) = one_row_attention(dt, (hq, hkv), (128, 128), 1);
            assert_eq!(group_of_four(&g, i), want, "{hq}/{hkv} {dt}");
        }
    }

    /// An attention of one batch row over a 40-position cache in `dt`: `heads` (query, kv) of
    /// `widths` (q/k, v), `t` query positions; the graph and the attention's node.
    fn one_row_attention(dt: DType, heads: (usize, usize), widths: (usize, usize), t: usize) -> (Graph, usize) {
        let ((hq, hkv), (d, dv)) = (heads, widths);
        let mut b = GraphBuilder::default();
        let q = b.input("q", dt, &[1, hq, t, d]);
        let len = b.input("len", DType::I32, &[1]);
        let k = b.state("k", dt, &[1, hkv, 40, d]);
        let v = b.state("v", dt, &[1, hkv, 40, dv]);
        let y = b.attention(q, k, v, len, 0.1, true, None, None).unwrap();
        let g = b.finish(&[y]);
        let i = g.nodes.iter().position(|n| n.op.name() == "attention").unwrap();
        (g, i)
    }
}

#[cfg(test)]
mod qmm_rows_tests {
    use super::*;
    use mlxcel_core::{DType, GraphBuilder, HostTensor};

    /// A product of `rows` rows of f16 x by a 4-bit group-64 n x k weight (zeros: planning
    /// looks at shapes).
    fn product(rows: usize, n: usize, k: usize) -> Graph {
        let mut b = GraphBuilder::default();
        let x = b.input("x", DType::F16, &[rows, k]);
        let w = b.parameter(
            "w",
            HostTensor::from_slice(&[n, k / 8], &vec![0u32; n * k / 8]).unwrap(),
        );
        let s = b.parameter(
            "s",
            HostTensor::from_f32(DType::F16, &[n, k / 64], &vec![1.0; n * k / 64]).unwrap(),
        );
        let y = b.quantized_matmul(x, w, s, s, 4, 64).unwrap();
        b.finish(&[y])
    }

    fn plan(rows: usize, n: usize, k: usize) -> Option<QmmRows> {
        let g = product(rows, n, k);
        let i = g.nodes.iter().position(|n| n.op.name() == "quantized_matmul").unwrap();
        qmm_rows_plan(&g, i)
    }

    #[test]
    fn the_ring_takes_scales_in_x_dtype_and_groups_of_32_or_64_only() {
        let ring = |x, scales, group| qmm_ring_smem(x, scales, group, 16);
        assert!(ring(DType::F16, DType::F16, 32).is_some());
        assert!(ring(DType::BF16, DType::BF16, 64).is_some());
        assert!(ring(DType::F16, DType::BF16, 64).is_none(), "scales in another dtype");
        assert!(ring(DType::F16, DType::F32, 64).is_none(), "32-bit scales");
        assert!(
            ring(DType::F16, DType::F16, 128).is_none(),
            "a chunk's scale of a row is 2 bytes"
        );
        assert_eq!(ring(DType::F16, DType::F16, 32), Some(16 * 36 * 16 + 12 * 2560));
    }

    #[test]
    fn a_few_rows_take_qmm_rows_with_k_split_for_narrow_weights() {
        assert!(plan(1, 4096, 4096).is_none(), "one row is the GEMV's");
        assert!(plan(65, 4096, 4096).is_none(), "past 64 rows is cuBLAS's");
        assert!(plan(8, 4100, 4096).is_none(), "n must be whole 16-row tiles");
        if !qmm_ring_on() {
            // qmm_rows: two blocks an SM; 112 blocks take 2 splits (224), 3 would spill.
            let q = plan(64, 14336, 4096).unwrap();
            assert_eq!((q.name, q.splits, q.per_split, q.smem), ("qmm_rows_f16_8", 2, 16, 0));
            return;
        }
        let q = plan(8, 4096, 4096).unwrap();
        assert_eq!(q.name, "qmm_ring_f16_1");
        // 32 blocks of 128 rows: 8 splits of the 32 chunks for about three blocks an SM.
        assert_eq!((q.splits, q.per_split), (8, 4));
        let q = plan(64, 14336, 4096).unwrap();
        // 112 blocks: 3 splits (336 blocks) fill one wave of three an SM; 4 would spill.
        assert_eq!((q.name, q.splits, q.per_split), ("qmm_ring_f16_8", 3, 11));
        // 64 KiB: x staged twice (64 rows of 36 16-byte words) and 4 warps' 3 stages of 2304 bytes.
        assert_eq!(q.smem, 64 * 36 * 16 + 12 * 2304);
        // A wide weight (the LM head) needs no split, so no partials; 33 rows are 5 tiles of 8,
        // taken as 8 (the last three zeros).
        let q = plan(33, 128256, 4096).unwrap();
        assert_eq!((q.name, q.splits), ("qmm_ring_f16_8", 1));
        let g = product(33, 128256, 4096);
        let i = g.nodes.iter().position(|n| n.op.name() == "quantized_matmul").unwrap();
        assert_eq!(
            shared_scratch_bytes(&g, i, true, &super::super::fuse::Fusion::none(g.nodes.len())),
            0,
            "no expanded weight for cuBLAS either"
        );
        let g = product(64, 4096, 4096);
        let i = g.nodes.iter().position(|n| n.op.name() == "quantized_matmul").unwrap();
        assert_eq!(
            shared_scratch_bytes(&g, i, true, &super::super::fuse::Fusion::none(g.nodes.len())),
            8 * 64 * 4096 * 4
        );
    }

    #[test]
    fn a_batched_steps_q_k_and_v_take_one_ring_launch_split_to_fill_the_gpu() {
        // llama-3.1-8b's q, k and v at 64 rows: 32 + 8 + 8 blocks of 128 rows.
        let (rows, k) = (64, 4096);
        let mut b = GraphBuilder::default();
        let x = b.input("x", DType::F16, &[rows, k]);
        let outs: Vec<_> = [4096usize, 1024, 1024]
            .into_iter()
            .map(|n| {
                let w = b.parameter(
                    "w",
                    HostTensor::from_slice(&[n, k / 8], &vec![0u32; n * k / 8]).unwrap(),
                );
                let s = b.parameter(
                    "s",
                    HostTensor::from_f32(DType::F16, &[n, k / 64], &vec![1.0; n * k / 64]).unwrap(),
                );
                b.quantized_matmul(x, w, s, s, 4, 64).unwrap()
            })
            .collect();
        let g = b.finish(&outs);
        let parts: Vec<usize> = outs.iter().map(|o| o.index()).collect();
        let fusion = super::super::fuse::Fusion::find(&g);
        let scratch = shared_scratch_bytes(&g, parts[2], false, &fusion);
        let Some(q) = qmm_products_plan(&g, &parts) else {
            assert!(!qmm_ring_on() || std::env::var("MLXCEL_QMM_QKV").is_ok_and(|v| v == "0"));
            // Three qmm_rows launches; the anchor's scratch is v's own partials.
            assert_eq!(scratch, 8 * rows * 1024 * 4);
            return;
        };
        // 48 blocks: 8 splits of the 32 chunks (384 blocks, within three an SM of 132 SMs).
        assert_eq!((q.name, q.n, q.splits, q.per_split), ("qmm_ring3_f16_8", 6144, 8, 4));
        assert_eq!(q.grid(), (48, 8));
        assert_eq!(scratch, 8 * rows * 6144 * 4, "the partials of all three");
        // A fourth part does not fit the launch.
        assert!(qmm_products_plan(&g, &[parts[0], parts[1], parts[2], parts[0]]).is_none());
    }

    /// A routed product of `tokens` tokens, two slots each, over 8 experts of n x k 4-bit
    /// group-`group` weights (zeros), and the grouped kernel it takes with its rows a block.
    fn grouped(tokens: usize, n: usize, k: usize, group: usize) -> Option<(&'static str, usize)> {
        let (e, top) = (8, 2);
        let mut b = GraphBuilder::default();
        let x = b.input("x", DType::BF16, &[tokens, 1, k]);
        let ids = b.input("ids", DType::U32, &[tokens, top]);
        let w = b.parameter(
            "w",
            HostTensor::from_slice(&[e, n, k / 8], &vec![0u32; e * n * k / 8]).unwrap(),
        );
        let scales = &vec![1.0; e * n * k / group];
        let s = b.parameter(
            "s",
            HostTensor::from_f32(DType::BF16, &[e, n, k / group], scales).unwrap(),
        );
        let y = b.gather_qmm(x, w, s, s, ids, 4, group).unwrap();
        let g = b.finish(&[y]);
        let i = g.nodes.iter().position(|n| n.op.name() == "gather_qmm").unwrap();
        grouped_qmm_kernel(&g, i).map(|g| (g.name, g.rows))
    }

    #[test]
    fn prefill_routed_products_take_the_grouped_kernel_their_shape_allows() {
        assert_eq!(grouped(16, 768, 2048, 64), None, "32 pairs are the decode kernels'");
        assert_eq!(grouped(512, 768, 2048, 64), Some(("grouped_rows_bf16_4", QR_ROWS)));
        assert_eq!(grouped(512, 2048, 768, 32), Some(("grouped_rows_bf16_4", QR_ROWS)));
        assert_eq!(
            grouped(512, 24, 2048, 64),
            Some(("grouped_qmm_bf16", 64)),
            "n not whole 16-row tiles"
        );
        assert_eq!(
            grouped(512, 768, 192, 64),
            Some(("grouped_qmm_bf16", 64)),
            "k not whole 128-value chunks"
        );
        assert_eq!(grouped(512, 768, 96, 32), None, "k not whole 64-value chunks");
        let g = Grouped {
            name: "",
            rows: QR_ROWS,
            pairs: 64,
        };
        // 4096 pairs: 64 full tiles, and a partial one each for up to 128 experts.
        assert_eq!(g.max_tiles(4096, 128), 192);
        // 100 pairs over 128 experts: at most 100 experts chosen, each a partial tile.
        assert_eq!(g.max_tiles(100, 128), 2 + 100);
    }
}
