//! The CUDA backend against the CPU backend on every op case, and the kernels' compilation.
//! Without a GPU (or NVRTC) these print a notice and pass, unless MLXCEL_REQUIRE_CUDA=1 (set on
//! the GPU machine by .gpu/run-tests.sh) or MLXCEL_REQUIRE_NVRTC=1 (set by CI) makes them fail.

use mlxcel_core::testing::{cases, check_cases, run_case};
use mlxcel_core::Error;
use mlxcel_cpu::CpuBackend;
use mlxcel_cuda::CudaBackend;

fn required(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v == "1")
}

/// `graph` after the default passes (what a session plans).
fn passed(graph: &mlxcel_core::Graph) -> mlxcel_core::Graph {
    mlxcel_core::passes::run_passes(graph, &mlxcel_core::passes::default_passes()).unwrap()
}

/// Routed experts' SiLU-gated MLP at decode, silu(x·Gₑᵀ) · (x·Uₑᵀ) for e = ids: random gate and
/// up weights of `e` experts (`n` x `k`, 4-bit group 64 in x's dtype `act`) from `seed` and
/// `seed + 1`.
fn routed_glu(
    b: &mut mlxcel_core::GraphBuilder,
    x: mlxcel_core::NodeId,
    ids: mlxcel_core::NodeId,
    act: mlxcel_core::DType,
    (e, n, k): (usize, usize, usize),
    seed: u64,
) -> mlxcel_core::NodeId {
    use mlxcel_core::HostTensor;
    let mut experts = |seed: u64| {
        let w = noise(seed, e * n * k);
        let q = mlxcel_core::quant::quantize(&w, e * n, k, 4, 64);
        let packed = b.parameter("q", HostTensor::from_slice(&[e, n, k / 8], &q.packed).unwrap());
        let sc = b.parameter("s", HostTensor::from_f32(act, &[e, n, k / 64], &q.scales).unwrap());
        let bi = b.parameter("z", HostTensor::from_f32(act, &[e, n, k / 64], &q.biases).unwrap());
        b.gather_qmm(x, packed, sc, bi, ids, 4, 64).unwrap()
    };
    let g = experts(seed);
    let u = experts(seed + 1);
    let g = b.silu(g).unwrap();
    b.mul(g, u).unwrap()
}

/// `graph` after the default passes, which CUDA must run as one kernel launch (`what` says which).
fn one_launch(graph: &mlxcel_core::Graph, what: &str) -> mlxcel_core::Graph {
    let graph = passed(graph);
    assert_eq!(
        CudaBackend::launches_per_run(&graph).unwrap(),
        1,
        "{what} in one launch"
    );
    graph
}

#[test]
fn every_kernel_compiles_to_ptx_for_hopper() {
    match CudaBackend::kernel_ptx("sm_90") {
        Ok(ptx) => {
            assert!(ptx.len() > 1000, "suspiciously small PTX ({} bytes)", ptx.len());
            check_registers(&ptx);
        }
        Err(e) if !required("MLXCEL_REQUIRE_NVRTC") && !required("MLXCEL_REQUIRE_CUDA") => {
            eprintln!("skipping the kernel compile check: {e}");
        }
        Err(e) => panic!("{e}"),
    }
}

/// Kernels whose speed depends on staying under a register count: blocks an SM are given out
/// by registers, 8 a thread at a time, so one register over a step can cost a block an SM (the
/// tensor-core GEMV at 66 registers fit one 512-thread block an SM instead of two, and
/// llama-3.1-8b decoded 9% slower).
const REGISTER_LIMITS: &[(&str, u32, &str)] = &[
    ("tc_qgemv_f16_4", 64, "two 512-thread blocks an SM"),
    ("tc_qgemv_bf16_4", 64, "two 512-thread blocks an SM"),
    ("tc_qgemv3_f16_4", 64, "two 512-thread blocks an SM"),
    ("tc_qgemv3_bf16_4", 64, "two 512-thread blocks an SM"),
    ("tc_qgemv3_rope_f16_4", 64, "two 512-thread blocks an SM"),
    ("tc_qgemv3_rope_bf16_4", 64, "two 512-thread blocks an SM"),
    ("tc_qglu_f16_4", 128, "four 128-thread blocks an SM"),
    ("tc_qglu_bf16_4", 128, "four 128-thread blocks an SM"),
    ("grouped_qmm_f16", 168, "three 128-thread blocks an SM"),
    ("grouped_qmm_bf16", 168, "three 128-thread blocks an SM"),
    ("grouped_rows_f16_8", 255, "two 128-thread blocks an SM"),
    ("grouped_rows_bf16_8", 255, "two 128-thread blocks an SM"),
    ("grouped_rows_f16_4", 168, "three 128-thread blocks an SM"),
    ("grouped_rows_bf16_4", 168, "three 128-thread blocks an SM"),
];

/// ptxas's register and spill counts for every kernel of the PTX: none may spill, and those of
/// REGISTER_LIMITS stay within theirs. ptxas comes from `$MLXCEL_PTXAS` or PATH (PyPI:
/// nvidia-cuda-nvcc); without it the check prints a notice and skips, unless
/// MLXCEL_REQUIRE_PTXAS=1 (set by CI).
fn check_registers(ptx: &str) {
    let ptxas = std::env::var_os("MLXCEL_PTXAS").unwrap_or_else(|| "ptxas".into());
    let dir = std::env::temp_dir().join(format!("mlxcel-ptxas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, out) = (dir.join("kernels.ptx"), dir.join("kernels.cubin"));
    std::fs::write(&src, ptx).unwrap();
    let run = std::process::Command::new(&ptxas)
        .args(["-arch=sm_90", "-v"])
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .output();
    std::fs::remove_dir_all(&dir).ok();
    let run = match run {
        Ok(r) if r.status.success() => r,
        Ok(r) => panic!("ptxas failed: {}", String::from_utf8_lossy(&r.stderr)),
        Err(e) if !required("MLXCEL_REQUIRE_PTXAS") => {
            return eprintln!("skipping the register check: {ptxas:?}: {e}");
        }
        Err(e) => panic!("{ptxas:?}: {e}"),
    };
    // "Compiling entry function 'NAME'", then "... N bytes spill stores ...", then "Used R registers".
    let log = String::from_utf8_lossy(&run.stderr);
    let (mut name, mut spills) = (String::new(), 0u32);
    let mut registers = std::collections::HashMap::new();
    // The number before the first run of `phrase`'s words in `line`.
    let number_before = |line: &str, phrase: &str| -> Option<u32> {
        let words: Vec<&str> = line.split_whitespace().map(|w| w.trim_end_matches(',')).collect();
        let want: Vec<&str> = phrase.split(' ').collect();
        let at = words.windows(want.len()).position(|w| w == want.as_slice())?;
        words.get(at.checked_sub(1)?)?.parse().ok()
    };
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            name = rest.split('\'').next().unwrap_or_default().to_string();
        } else if line.contains("spill stores") {
            // "N bytes stack frame, N bytes spill stores, N bytes spill loads": the number two
            // words before the first "spill".
            spills = number_before(line, "bytes spill").unwrap_or(0);
        } else if let Some(r) = line
            .contains("registers")
            .then(|| number_before(line, "registers"))
            .flatten()
        {
            registers.insert(name.clone(), (r, spills));
        }
    }
    assert!(
        registers.len() > 100,
        "ptxas reported {} kernels:\n{log}",
        registers.len()
    );
    let spilling: Vec<_> = registers.iter().filter(|(_, &(_, s))| s > 0).collect();
    assert!(
        spilling.is_empty(),
        "kernels that spill (registers, spill bytes): {spilling:?}"
    );
    for &(kernel, limit, why) in REGISTER_LIMITS {
        let &(used, _) = registers
            .get(kernel)
            .unwrap_or_else(|| panic!("ptxas did not report {kernel}"));
        assert!(used <= limit, "{kernel} uses {used} registers, over {limit} ({why})");
    }
}

/// Writes the kernels' PTX for sm_90 into `$MLXCEL_CACHE_DIR` under driver version
/// `$MLXCEL_PTX_DRIVER` (default 13000), for a GPU machine that would otherwise compile them
/// itself on every cold start. A development aid: run with `--ignored`.
#[test]
#[ignore]
fn write_kernel_cache() {
    let dir = std::env::var_os("MLXCEL_CACHE_DIR").expect("MLXCEL_CACHE_DIR");
    let driver = std::env::var("MLXCEL_PTX_DRIVER").map_or(13000, |v| v.parse().expect("a driver version"));
    let path = CudaBackend::precompile_kernels("sm_90", driver, std::path::Path::new(&dir)).unwrap();
    println!("wrote {}", path.display());
}

#[test]
fn an_unloaded_graph_frees_its_buffers_and_others_still_run() {
    use mlxcel_core::{Backend, CompileOptions, DType, GraphBuilder, HostTensor};
    let cuda = match CudaBackend::new() {
        Ok(b) => b,
        Err(e) if !required("MLXCEL_REQUIRE_CUDA") => return eprintln!("skipping CUDA unload: {e}"),
        Err(e) => panic!("{e}"),
    };
    let graph = |n: usize| {
        let mut b = GraphBuilder::default();
        let x = b.input("x", DType::F32, &[n]);
        let y = b.mul_scalar(x, 2.0).unwrap();
        let y = b.add_scalar(y, 1.0).unwrap();
        b.finish(&[y])
    };
    let mut s = cuda.new_session().unwrap();
    let big = s.load(&graph(1 << 20), CompileOptions::default()).unwrap();
    let small = s.load(&graph(5), CompileOptions::default()).unwrap();
    let x = HostTensor::from_f32(DType::F32, &[5], &[0.0, 1.0, 2.0, 3.0, 4.0]).unwrap();
    let xb = HostTensor::from_f32(DType::F32, &[1 << 20], &vec![1.0; 1 << 20]).unwrap();
    // Twice each: the second run of a graph is the one captured.
    for _ in 0..2 {
        s.run(big, std::slice::from_ref(&xb)).unwrap();
        s.run(small, std::slice::from_ref(&x)).unwrap();
    }
    let before = s.memory().planned_bytes;
    s.unload(big).unwrap();
    assert!(s.memory().planned_bytes < before);
    assert!(s.run(big, std::slice::from_ref(&xb)).is_err());
    assert!(s.unload(big).is_err());
    let y = s.run(small, std::slice::from_ref(&x)).unwrap()[0].to_f32_vec();
    assert_eq!(y, vec![1.0, 3.0, 5.0, 7.0, 9.0]);
}

#[test]
fn op_cases_match_the_cpu_backend() {
    let cuda = match CudaBackend::new() {
        Ok(b) => b,
        Err(e) if !required("MLXCEL_REQUIRE_CUDA") => return eprintln!("skipping CUDA op cases: {e}"),
        Err(e) => panic!("{e}"),
    };
    let all = cases::all();
    // Cases whose ops this backend does not run yet are listed, not hidden.
    let (mut runnable, mut unsupported) = (Vec::new(), Vec::new());
    for case in all {
        match run_case(&cuda, &case) {
            Err(Error::Unsupported { op, .. }) => unsupported.push(format!("{}: {op}", case.name)),
            _ => runnable.push(case),
        }
    }
    eprintln!(
        "{} op cases unsupported on CUDA:\n  {}",
        unsupported.len(),
        unsupported.join("\n  ")
    );
    let failures = check_cases(&cuda, &runnable, |c| run_case(&CpuBackend, c));
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from the CPU:\n{}",
        failures.len(),
        runnable.len(),
        failures.join("\n")
    );
    assert!(runnable.len() > 300, "only {} cases ran on CUDA", runnable.len());
}

/// Seeded values in [-1, 1).
fn noise(seed: u64, n: usize) -> Vec<f32> {
    mlxcel_core::rng::SplitMix64(seed).signed_vec(n, 1.0)
}

/// `x · Wᵀ` for a noise weight `[n, k]` (from `seed`): dense in `dt` when `bits` is 0, else
/// quantized MLX-style to `(bits, group)` with scales and biases in `dt`.
fn projection(
    b: &mut mlxcel_core::GraphBuilder,
    x: mlxcel_core::NodeId,
    seed: u64,
    (n, k): (usize, usize),
    (bits, group): (u32, usize),
    dt: mlxcel_core::DType,
) -> mlxcel_core::NodeId {
    use mlxcel_core::HostTensor;
    let w = noise(seed, n * k);
    if bits == 0 {
        let w = b.parameter("w", HostTensor::from_f32(dt, &[n, k], &w).unwrap());
        return b.matmul_t(x, w).unwrap();
    }
    let q = mlxcel_core::quant::quantize(&w, n, k, bits, group);
    let packed = b.parameter(
        "q",
        HostTensor::from_slice(&[n, k * bits as usize / 32], &q.packed).unwrap(),
    );
    let sc = b.parameter("s", HostTensor::from_f32(dt, &[n, k / group], &q.scales).unwrap());
    let bi = b.parameter("z", HostTensor::from_f32(dt, &[n, k / group], &q.biases).unwrap());
    b.quantized_matmul(x, packed, sc, bi, bits, group).unwrap()
}

/// rms_norm(h + d) over inputs h and d [1, 1, k] of `act`, with a noise weight [k] in `nwdt`
/// from `seed` (`unit`: 1 + w, Gemma's form), eps 1e-6: the residual sum and the norm.
fn normed_sum(
    b: &mut mlxcel_core::GraphBuilder,
    act: mlxcel_core::DType,
    nwdt: mlxcel_core::DType,
    k: usize,
    seed: u64,
    unit: bool,
) -> (mlxcel_core::NodeId, mlxcel_core::NodeId) {
    let h = b.input("h", act, &[1, 1, k]);
    let d = b.input("d", act, &[1, 1, k]);
    let nw = b.parameter(
        "norm",
        mlxcel_core::HostTensor::from_f32(nwdt, &[k], &noise(seed, k)).unwrap(),
    );
    let sum = b.add(h, d).unwrap();
    (sum, b.rms_norm(sum, nw, 1e-6, unit).unwrap())
}

/// The decode patterns the CUDA backend fuses (gated MLP over quantized and dense weights,
/// residual add + RMSNorm) and the GEMV kernels, in several dtypes and row counts, against the
/// CPU backend (which runs the plain ops).
/// The tail both attention-step builders share: q and k (as [B, H, T, D]) rotated at `positions`
/// (rope over the first `dims` of `d` channels), k and v written into the caches at `pos`, and
/// attention over the caches up to `pos + t`; the graph's outputs are the attention and both
/// written caches, after the default passes.
fn rope_write_attend(
    mut g: mlxcel_core::GraphBuilder,
    [q, k, v]: [mlxcel_core::NodeId; 3],
    [kc, vc]: [mlxcel_core::NodeId; 2],
    [positions, pos]: [mlxcel_core::NodeId; 2],
    (d, dims, interleaved): (usize, usize, bool),
    t: usize,
) -> mlxcel_core::Graph {
    use mlxcel_core::{DType, HostTensor};
    let freqs: Vec<f32> = (0..dims / 2)
        .map(|i| 10_000f32.powf(-2.0 * i as f32 / dims as f32))
        .collect();
    let freqs = g.constant(HostTensor::from_f32(DType::F32, &[dims / 2], &freqs).unwrap());
    let q = g.rope(q, positions, freqs, dims, interleaved, 1.0).unwrap();
    let k = g.rope(k, positions, freqs, dims, interleaved, 1.0).unwrap();
    let kw = g.kv_write(kc, k, pos).unwrap();
    let vw = g.kv_write(vc, v, pos).unwrap();
    let len = g.add_scalar(pos, t as f32).unwrap();
    let o = g
        .attention(q, kw, vw, len, 1.0 / (d as f32).sqrt(), true, None, None)
        .unwrap();
    passed(&g.finish(&[o, kw, vw]))
}

/// One decode step's rope, cache writes and attention (the queries' and keys' rope, both
/// caches written at the step's position, attention over them), batch rows at positions `at`:
/// the pattern whose rope and writes CUDA folds into the attention's split kernel. Returns the
/// graph and its case inputs (q, k, v, rope positions, write positions) and initial caches.
#[allow(clippy::type_complexity)]
fn rope_decode_step(
    dt: mlxcel_core::DType,
    (hq, hkv, d, dims): (usize, usize, usize, usize),
    interleaved: bool,
    cap: usize,
    at: &[usize],
) -> (
    mlxcel_core::Graph,
    Vec<mlxcel_core::HostTensor>,
    Vec<(String, mlxcel_core::HostTensor)>,
) {
    use mlxcel_core::{DType, GraphBuilder, HostTensor};
    let b = at.len();
    let mut g = GraphBuilder::default();
    let kc = g.state("k_cache", dt, &[b, hkv, cap, d]);
    let vc = g.state("v_cache", dt, &[b, hkv, cap, d]);
    let q = g.input("q", dt, &[b, hq, 1, d]);
    let k = g.input("k", dt, &[b, hkv, 1, d]);
    let v = g.input("v", dt, &[b, hkv, 1, d]);
    let positions = g.input("positions", DType::I32, &[b, 1]);
    let pos = g.input("pos", DType::I32, &[b]);
    let graph = rope_write_attend(g, [q, k, v], [kc, vc], [positions, pos], (d, dims, interleaved), 1);
    let at_f: Vec<f32> = at.iter().map(|&p| p as f32).collect();
    let inputs = vec![
        HostTensor::from_f32(dt, &[b, hq, 1, d], &noise(61, b * hq * d)).unwrap(),
        HostTensor::from_f32(dt, &[b, hkv, 1, d], &noise(62, b * hkv * d)).unwrap(),
        HostTensor::from_f32(dt, &[b, hkv, 1, d], &noise(63, b * hkv * d)).unwrap(),
        HostTensor::from_f32(DType::I32, &[b, 1], &at_f).unwrap(),
        HostTensor::from_f32(DType::I32, &[b], &at_f).unwrap(),
    ];
    let cache = |seed| HostTensor::from_f32(dt, &[b, hkv, cap, d], &noise(seed, b * hkv * cap * d)).unwrap();
    let states = vec![("k_cache".to_string(), cache(64)), ("v_cache".to_string(), cache(65))];
    (graph, inputs, states)
}

/// Qwen3's attention inputs at T positions: q, k and v as the products leave them ([B, T, H, D]),
/// each query and key head RMS-normalized (`normed`; Gemma's 1 + w with `unit_offset`), moved to
/// [B, H, T, D], rotated (partial rotary where dims < d), written into the caches at position
/// `at`, attention over them. CUDA folds the norms into the rope-and-write launch. Returns the
/// graph, its inputs (q, k, v, rope positions, write position) and initial caches.
#[allow(clippy::type_complexity)]
fn qk_norm_step(
    dt: mlxcel_core::DType,
    (hq, hkv, d, dims): (usize, usize, usize, usize),
    t: usize,
    normed: Option<bool>,
    at: usize,
) -> (
    mlxcel_core::Graph,
    Vec<mlxcel_core::HostTensor>,
    Vec<(String, mlxcel_core::HostTensor)>,
) {
    use mlxcel_core::{DType, GraphBuilder, HostTensor};
    let cap = at + t + 3;
    let mut g = GraphBuilder::default();
    let kc = g.state("k_cache", dt, &[1, hkv, cap, d]);
    let vc = g.state("v_cache", dt, &[1, hkv, cap, d]);
    let q = g.input("q", dt, &[1, t, hq, d]);
    let k = g.input("k", dt, &[1, t, hkv, d]);
    let v = g.input("v", dt, &[1, t, hkv, d]);
    let positions = g.input("positions", DType::I32, &[t]);
    let pos = g.input("pos", DType::I32, &[]);
    let head = |g: &mut GraphBuilder, x, seed| {
        let x = match normed {
            Some(unit_offset) => {
                let w = g.parameter("w", HostTensor::from_f32(dt, &[d], &noise(seed, d)).unwrap());
                g.rms_norm(x, w, 1e-6, unit_offset).unwrap()
            }
            None => x,
        };
        g.swap_axes(x, 1, 2).unwrap()
    };
    let (q, k, v) = (head(&mut g, q, 71), head(&mut g, k, 72), g.swap_axes(v, 1, 2).unwrap());
    let graph = rope_write_attend(g, [q, k, v], [kc, vc], [positions, pos], (d, dims, false), t);
    let positions: Vec<f32> = (at..at + t).map(|p| p as f32).collect();
    let inputs = vec![
        HostTensor::from_f32(dt, &[1, t, hq, d], &noise(73, t * hq * d)).unwrap(),
        HostTensor::from_f32(dt, &[1, t, hkv, d], &noise(74, t * hkv * d)).unwrap(),
        HostTensor::from_f32(dt, &[1, t, hkv, d], &noise(75, t * hkv * d)).unwrap(),
        HostTensor::from_f32(DType::I32, &[t], &positions).unwrap(),
        HostTensor::from_f32(DType::I32, &[], &[at as f32]).unwrap(),
    ];
    let cache = |seed| HostTensor::from_f32(dt, &[1, hkv, cap, d], &noise(seed, hkv * cap * d)).unwrap();
    let states = vec![("k_cache".to_string(), cache(76)), ("v_cache".to_string(), cache(77))];
    (graph, inputs, states)
}

/// One decode step of an attention layer from its input: x (or rms_norm(h + d) with `normed`)
/// through q, k and v products of k values (4-bit at group 64, or dense where `bits` is 0;
/// with `bias`, each plus a bias vector, as Qwen2's), reshaped to heads (with `qk_norm`, q's
/// and k's heads RMSNorm'd, with the unit offset or not, as Qwen3's and Gemma 3's) and moved to
/// [1, H, 1, D], then rope (every channel, `interleaved` or not), the cache writes at position
/// `at` and attention (rope_write_attend). CUDA runs the products, the norms, the rope and the
/// writes as one launch (`tc_qgemv3_rope`, `dsk_gemv3_rope`). Returns the graph, its inputs (x
/// or h and d, rope positions, write position) and initial caches.
#[allow(clippy::type_complexity)]
fn projected_rope_step(
    dt: mlxcel_core::DType,
    (hq, hkv, d): (usize, usize, usize),
    (k, bits): (usize, u32),
    (interleaved, normed, bias, qk_norm): (bool, bool, bool, Option<bool>),
    (at, cap): (usize, usize),
) -> (
    mlxcel_core::Graph,
    Vec<mlxcel_core::HostTensor>,
    Vec<(String, mlxcel_core::HostTensor)>,
) {
    use mlxcel_core::{DType, GraphBuilder, HostTensor};
    let mut g = GraphBuilder::default();
    let x = if normed {
        normed_sum(&mut g, dt, dt, k, 91, false).1
    } else {
        g.input("x", dt, &[1, 1, k])
    };
    // The three products, then their biases (the order models build them in).
    let ys: Vec<_> = [hq, hkv, hkv]
        .iter()
        .enumerate()
        .map(|(i, &h)| projection(&mut g, x, 92 + i as u64, (h * d, k), (bits, 64), dt))
        .collect();
    let ys: Vec<_> = ys
        .into_iter()
        .zip([hq, hkv, hkv])
        .enumerate()
        .map(|(i, (y, h))| {
            if !bias {
                return y;
            }
            let noise: Vec<f32> = noise(95 + i as u64, h * d).iter().map(|v| v / 4.0).collect();
            let b = g.parameter("b", HostTensor::from_f32(dt, &[h * d], &noise).unwrap());
            g.add(y, b).unwrap()
        })
        .collect();
    let heads: Vec<_> = ys
        .iter()
        .zip([hq, hkv, hkv])
        .enumerate()
        .map(|(i, (&y, h))| {
            let mut y = g.reshape(y, &[1, 1, h, d]).unwrap();
            if let (Some(unit_offset), true) = (qk_norm, i < 2) {
                let w = g.parameter("w", HostTensor::from_f32(dt, &[d], &noise(101 + i as u64, d)).unwrap());
                y = g.rms_norm(y, w, 1e-6, unit_offset).unwrap();
            }
            g.swap_axes(y, 1, 2).unwrap()
        })
        .collect();
    let kc = g.state("k_cache", dt, &[1, hkv, cap, d]);
    let vc = g.state("v_cache", dt, &[1, hkv, cap, d]);
    let positions = g.input("positions", DType::I32, &[1]);
    let pos = g.input("pos", DType::I32, &[]);
    let graph = rope_write_attend(
        g,
        [heads[0], heads[1], heads[2]],
        [kc, vc],
        [positions, pos],
        (d, d, interleaved),
        1,
    );
    // x a quarter of noise, so the products stay near 1 (they are the rope's and the
    // attention's inputs, whose errors the caches show unscaled).
    let quarter = |seed| {
        let v: Vec<f32> = noise(seed, k).iter().map(|v| v / 4.0).collect();
        HostTensor::from_f32(dt, &[1, 1, k], &v).unwrap()
    };
    let mut inputs = if normed {
        vec![quarter(97), quarter(98)]
    } else {
        vec![quarter(97)]
    };
    inputs.push(HostTensor::from_f32(DType::I32, &[1], &[at as f32]).unwrap());
    inputs.push(HostTensor::from_f32(DType::I32, &[], &[at as f32]).unwrap());
    let cache = |seed| HostTensor::from_f32(dt, &[1, hkv, cap, d], &noise(seed, hkv * cap * d)).unwrap();
    let states = vec![("k_cache".to_string(), cache(99)), ("v_cache".to_string(), cache(100))];
    (graph, inputs, states)
}

/// The shapes the products-with-rope launch is checked in: (dtype, (hq, hkv, d), (k, bits),
/// (interleaved, normed, bias, qk_norm), (position, cache length)). 4-bit: 64-wide heads after
/// a norm, 128-wide with k not a multiple of 256, interleaved 32-wide heads writing the cache's
/// last slot, Qwen2's biases. Dense: 8, 4 and 2 rows a block (k up to 1024, 2048 and 4096),
/// with Qwen2's biases and an interleaved rope among them. 4-bit with per-head q and k norms:
/// Qwen3's 128-wide heads after a norm, Gemma's 1 + w over 64-wide heads at the cache's last
/// slot, interleaved 32-wide heads with biases. The next two have k long enough for two chunks
/// a warp where the warps are forced few (`MLXCEL_TC_WARPS=2` takes the double-buffered launch
/// there, and with `MLXCEL_TC_DB_QKV=1` the clustered one with norms too). Last, Gemma 3's
/// shape: 1 + w norms over 256-wide heads, a head's tiles in a cluster of 16 blocks where the
/// device runs one, else tickets.
#[allow(clippy::type_complexity)]
const PROJECTED_ROPE: [(
    mlxcel_core::DType,
    (usize, usize, usize),
    (usize, u32),
    (bool, bool, bool, Option<bool>),
    (usize, usize),
); 13] = [
    (
        mlxcel_core::DType::F16,
        (4, 2, 64),
        (256, 4),
        (false, true, false, None),
        (17, 40),
    ),
    (
        mlxcel_core::DType::BF16,
        (4, 2, 128),
        (320, 4),
        (false, false, false, None),
        (0, 8),
    ),
    (
        mlxcel_core::DType::F16,
        (6, 2, 32),
        (256, 4),
        (true, true, false, None),
        (31, 32),
    ),
    (
        mlxcel_core::DType::BF16,
        (2, 1, 64),
        (512, 4),
        (false, true, true, None),
        (5, 12),
    ),
    (
        mlxcel_core::DType::F16,
        (14, 2, 64),
        (896, 0),
        (false, true, true, None),
        (9, 16),
    ),
    (
        mlxcel_core::DType::BF16,
        (4, 2, 64),
        (1536, 0),
        (true, false, false, None),
        (3, 8),
    ),
    (
        mlxcel_core::DType::F16,
        (2, 1, 128),
        (3072, 0),
        (false, true, false, None),
        (7, 8),
    ),
    (
        mlxcel_core::DType::F16,
        (8, 2, 128),
        (256, 4),
        (false, true, false, Some(false)),
        (9, 24),
    ),
    (
        mlxcel_core::DType::BF16,
        (4, 2, 64),
        (320, 4),
        (false, false, false, Some(true)),
        (15, 16),
    ),
    (
        mlxcel_core::DType::F16,
        (6, 2, 32),
        (256, 4),
        (true, true, true, Some(false)),
        (3, 8),
    ),
    (
        mlxcel_core::DType::F16,
        (8, 2, 128),
        (2048, 4),
        (false, true, false, None),
        (20, 32),
    ),
    (
        mlxcel_core::DType::BF16,
        (8, 2, 128),
        (1344, 4),
        (false, true, false, Some(false)),
        (11, 16),
    ),
    (
        mlxcel_core::DType::BF16,
        (4, 1, 256),
        (512, 4),
        (false, true, false, Some(true)),
        (7, 16),
    ),
];

/// The products, rope and cache writes of each PROJECTED_ROPE step are one launch, the step
/// three with the length's add and the attention (no GPU needed to count them).
#[test]
fn q_k_v_products_write_the_rope_and_the_caches() {
    for (dt, heads, k, flags, place) in PROJECTED_ROPE {
        let (graph, _, _) = projected_rope_step(dt, heads, k, flags, place);
        let families = CudaBackend::launch_families(&graph).unwrap();
        let launches: usize = families.iter().map(|(_, n)| n).sum();
        let norms = if flags.3.is_some() { "+qk_norm" } else { "" };
        let fused = families
            .iter()
            .any(|(f, _)| f.contains("3 products") && f.contains(&format!("{norms}+rope+kv_write")));
        assert!(fused && launches == 3, "{dt} {heads:?} {flags:?}: {families:?}");
    }
}

/// The shapes the per-head norm fold is checked in: decode (one position) and prefill (three),
/// Qwen3's 128-wide heads, Gemma's 1 + w over 256-wide heads (folded only with
/// `MLXCEL_CUDA_FUSE_QK_NORM=all`; on the H100 the kernel passed there too), partial rotary over
/// 64-wide.
#[allow(clippy::type_complexity)]
const QK_NORM: [(mlxcel_core::DType, (usize, usize, usize, usize), usize, bool, usize); 5] = [
    (mlxcel_core::DType::F16, (8, 2, 128, 128), 1, false, 30),
    (mlxcel_core::DType::BF16, (8, 2, 128, 128), 1, false, 0),
    (mlxcel_core::DType::F16, (8, 2, 128, 128), 3, false, 5),
    (mlxcel_core::DType::BF16, (4, 1, 256, 256), 1, true, 12),
    (mlxcel_core::DType::F16, (6, 2, 64, 32), 3, false, 9),
];

/// The per-head norms of heads up to 128 wide cost no launch of their own: each step launches
/// as many kernels as the same step without norms, but at one position, where this process
/// folds the plain step's rope and writes into the attention (`fold_rope_into_attention`) and a
/// normed step keeps its rope-and-write launch. Wider heads keep their two norm launches by
/// default (no GPU needed to count them).
#[test]
fn per_head_norms_fold_into_the_rope_and_cache_write() {
    fold_rope_into_attention();
    for (dt, shape, t, unit_offset, at) in QK_NORM {
        let (normed, _, _) = qk_norm_step(dt, shape, t, Some(unit_offset), at);
        let (plain, _, _) = qk_norm_step(dt, shape, t, None, at);
        let more = if shape.2 <= 128 { usize::from(t == 1) } else { 2 };
        assert_eq!(
            CudaBackend::launches_per_run(&normed).unwrap(),
            CudaBackend::launches_per_run(&plain).unwrap() + more,
            "{dt} {shape:?} t={t}"
        );
    }
}

/// The shapes the rope-folding attention kernels are checked in: the per-head kernel (64-wide
/// heads, a split a position), the grouped ones (4 and 8 channels a lane), two batch rows at
/// different positions with interleaved partial rotary, the last slot of the cache.
#[allow(clippy::type_complexity)]
const ROPE_DECODE: [(mlxcel_core::DType, (usize, usize, usize, usize), bool, usize, &[usize]); 4] = [
    (mlxcel_core::DType::F16, (4, 2, 64, 64), false, 40, &[17]),
    (mlxcel_core::DType::BF16, (8, 2, 128, 128), false, 300, &[250]),
    (mlxcel_core::DType::F16, (6, 2, 128, 64), true, 64, &[5, 40]),
    (mlxcel_core::DType::BF16, (4, 2, 256, 256), false, 50, &[49]),
];

/// Turns on the opt-in fold of decode rope and cache writes into the attention
/// (`MLXCEL_CUDA_FUSE_ROPE_ATTENTION=1`) for this test process. Every test here that reads
/// the variable sets this one value, and the graphs it changes compute the same values either
/// way, so tests running alongside may see it.
fn fold_rope_into_attention() {
    std::env::set_var("MLXCEL_CUDA_FUSE_ROPE_ATTENTION", "1");
}

/// With the fold on, the decode step's rope and cache writes run inside the attention's
/// launch: the step is the length's add and the attention, two launches (no GPU needed to
/// count them).
#[test]
fn decode_attention_takes_its_rope_and_cache_writes() {
    fold_rope_into_attention();
    for (dt, shape, interleaved, cap, at) in ROPE_DECODE {
        let (graph, _, _) = rope_decode_step(dt, shape, interleaved, cap, at);
        let launches = CudaBackend::launches_per_run(&graph).unwrap();
        assert_eq!(launches, 2, "{dt} {shape:?}: the length's add and the attention");
    }
}

#[test]
fn fused_decode_patterns_match_the_cpu_backend() {
    use mlxcel_core::testing::{OpCase, Tolerance};
    use mlxcel_core::{DType, GraphBuilder, HostTensor};
    // The cases (and their launch counts, which need no device) are built either way.
    let cuda = CudaBackend::new();
    let (k, n) = (256, 96);
    const GEMV_MAX: usize = 8; // rows a decode GEMV takes (launch.rs GEMV_ROWS)
    let mut cases = Vec::new();
    for (act, wdt) in [
        (DType::F32, DType::BF16),
        (DType::F16, DType::F16),
        (DType::BF16, DType::BF16),
    ] {
        // 3, 12 and 64 rows of 16-bit x by 4-bit weights: two qmm_ring launches (or qmm_rows
        // with MLXCEL_QMM_RING=0; with MLXCEL_QMM_GLU=1, qmm_ring_glu at 3 and 12 rows: gate,
        // up and act·mul in one launch, 2 blocks of 64 rows, k split in two); other weights: the
        // 8-row GEMV or cuBLAS; then act·mul as one elementwise launch.
        for rows in [1, 3, 12, 64] {
            for bits in [0u32, 4, 8] {
                let mut b = GraphBuilder::default();
                let x = b.input("x", act, &[1, rows, k]);
                let r = b.input("r", act, &[1, rows, k]);
                // The norm's weight a quarter of noise, so gate and up are about 1: at about 5
                // (session 16's first run of 64 rows), a one-ulp difference in a rounded product
                // of a 16-bit kernel, times the other factor, was past the tolerance (the cuBLAS
                // path at 8 bits too).
                let quarter: Vec<f32> = noise(9, k).iter().map(|v| v / 4.0).collect();
                let nw = b.parameter("norm", HostTensor::from_f32(wdt, &[k], &quarter).unwrap());
                let s = b.add(x, r).unwrap();
                let h = b.rms_norm(s, nw, 1e-5, false).unwrap();
                let proj = |b: &mut GraphBuilder, seed: u64| projection(b, h, seed, (n, k), (bits, 64), wdt);
                let g = proj(&mut b, 1);
                let g = b.silu(g).unwrap();
                let u = proj(&mut b, 2);
                let y = b.mul(g, u).unwrap();
                let graph = b.finish(&[y, s]);
                let out_dtype = graph.node(graph.outputs[0]).dtype;
                // Three rows of 16-bit x by 4-bit weights are qmm_rows's, which rounds each
                // weight to x's dtype as it expands it (as the cuBLAS path does): 2^-12 a weight,
                // amplified where act(g) is large and u cancels (one f16 element of 288 was off
                // by 0.0104 at 4x).
                // At 12 rows the cuBLAS path rounds expanded 4- and 8-bit weights likewise.
                let rounded = act != DType::F32 && ((rows > 1 && bits == 4) || (rows > GEMV_MAX && bits != 0));
                let factor = if rounded { 8.0 } else { 4.0 };
                cases.push(OpCase {
                    name: format!("fused glu {act} w{wdt} bits {bits} rows {rows}"),
                    graph: passed(&graph),
                    inputs: vec![
                        HostTensor::from_f32(act, &[1, rows, k], &noise(3, rows * k)).unwrap(),
                        HostTensor::from_f32(act, &[1, rows, k], &noise(4, rows * k)).unwrap(),
                    ],
                    states: vec![],
                    tolerance: vec![
                        Tolerance::for_dtype(out_dtype).scaled(factor),
                        Tolerance::for_dtype(act),
                    ],
                });
            }
        }
    }
    // Batched GLUs at groups of 32: GELU (tanh) and SiLU, 24, 12 and 40 rows (3, 2 and 5 tiles
    // of x, taken as 4, 2 and 8), 208 rows of weights (the last block has one live warp of
    // four), k of 1024 (8 chunks, split 8 ways). With MLXCEL_QMM_GLU=1, qmm_ring_glu up to 4
    // tiles (the partials' sum applies act·mul); else two qmm_ring launches.
    for (act, rows, n, unary) in [
        (DType::BF16, 24usize, 208usize, mlxcel_core::UnaryOp::GeluTanh),
        (DType::F16, 12, 48, mlxcel_core::UnaryOp::Silu),
        (DType::F16, 40, 48, mlxcel_core::UnaryOp::Silu),
    ] {
        let k = 1024;
        let mut b = GraphBuilder::default();
        let x = b.input("x", act, &[rows, k]);
        let proj = |b: &mut GraphBuilder, seed: u64| projection(b, x, seed, (n, k), (4, 32), act);
        let g = proj(&mut b, 41);
        let g = b.unary(unary, g).unwrap();
        let u = proj(&mut b, 42);
        let y = b.mul(g, u).unwrap();
        // One launch (and the partials' sum) with the ring, else the two products and act·mul;
        // the fusion itself is fuse.rs's unit test. x an eighth of noise, so gate and up are
        // about 1 (see the first GLU cases).
        let graph = passed(&b.finish(&[y]));
        let eighth: Vec<f32> = noise(43, rows * k).iter().map(|v| v / 8.0).collect();
        cases.push(OpCase {
            name: format!("fused batched glu {act} {unary:?} rows {rows} n {n}"),
            graph: passed(&graph),
            inputs: vec![HostTensor::from_f32(act, &[rows, k], &eighth).unwrap()],
            states: vec![],
            tolerance: vec![Tolerance::for_dtype(act).scaled(8.0)],
        });
    }
    // Gemma's GELU (tanh) gated MLP through the same fused kernels: 4-bit (CUDA cores, k not a
    // multiple of 64; tensor cores, with chunks that end in 192 values, or in a half chunk as
    // Gemma 3 1B's k = 1152 does) and dense, one row. k = 2048 is 8 chunks, two a warp with 4
    // warps (MLXCEL_TC_WARPS=4), where the double buffer's loop takes both of its halves; with
    // MLXCEL_TC_BLOCKS=2 a block takes several tiles.
    for (act, wdt, bits, k, group) in [
        (DType::BF16, DType::BF16, 4u32, 96usize, 32usize),
        (DType::BF16, DType::BF16, 4, 192, 64),
        (DType::F16, DType::F16, 4, 448, 64),
        (DType::F16, DType::F16, 4, 256, 64),
        (DType::BF16, DType::BF16, 4, 1152, 64),
        (DType::F16, DType::F16, 4, 2048, 64),
        (DType::BF16, DType::BF16, 0, 192, 64),
    ] {
        let n = 48;
        let mut b = GraphBuilder::default();
        let x = b.input("x", act, &[1, 1, k]);
        let proj = |b: &mut GraphBuilder, seed: u64| projection(b, x, seed, (n, k), (bits, group), wdt);
        let g = proj(&mut b, 31);
        let g = b.unary(mlxcel_core::UnaryOp::GeluTanh, g).unwrap();
        let u = proj(&mut b, 32);
        let y = b.mul(g, u).unwrap();
        let graph = b.finish(&[y]);
        let out_dtype = graph.node(graph.outputs[0]).dtype;
        cases.push(OpCase {
            name: format!("fused gelu glu {act} w{wdt} bits {bits} k {k} group {group}"),
            graph: passed(&graph),
            inputs: vec![HostTensor::from_f32(act, &[1, 1, k], &noise(7, k)).unwrap()],
            states: vec![],
            tolerance: vec![Tolerance::for_dtype(out_dtype).scaled(4.0)],
        });
    }
    // Attention's q, k and v: three 4-bit products of one x, launched as one (widths of two
    // sizes, k past one chunk, group 32); the first also read early in the second variant,
    // which keeps it apart.
    for act in [DType::F16, DType::BF16] {
        for early in [false, true] {
            let k = 512;
            let mut b = GraphBuilder::default();
            let x = b.input("x", act, &[1, 1, k]);
            let mut outs = Vec::new();
            for (seed, n) in [(11u64, 64usize), (12, 32), (13, 32)] {
                let mut y = projection(&mut b, x, seed, (n, k), (4, 32), act);
                if early && outs.is_empty() {
                    y = b.silu(y).unwrap();
                }
                outs.push(y);
            }
            let graph = b.finish(&outs);
            cases.push(OpCase {
                name: format!("fused q/k/v products {act} early read {early}"),
                graph: passed(&graph),
                inputs: vec![HostTensor::from_f32(act, &[1, 1, k], &noise(5, k)).unwrap()],
                states: vec![],
                tolerance: vec![Tolerance::for_dtype(act).scaled(4.0); 3],
            });
        }
    }
    // A batched step's q, k and v: with MLXCEL_QMM_RING=1 one qmm_ring3 launch (each product its
    // own blocks of 128 rows; the last of 208 rows has one live warp), k split (1024: 8 chunks)
    // so qmm_rows_sum3 adds the partials and the biases, or not split (128: 1 chunk) so the
    // kernel adds the biases itself; 5, 24 and 64 rows (1, 4 and 8 tiles of x, the first two
    // partly zeros), groups of 32 and 64.
    for (act, rows, k, group, biased) in [
        (DType::F16, 24usize, 1024usize, 64usize, true),
        (DType::BF16, 64, 1024, 32, false),
        (DType::F16, 5, 128, 32, true),
        (DType::BF16, 64, 128, 64, true),
    ] {
        let mut b = GraphBuilder::default();
        let x = b.input("x", act, &[rows, k]);
        let widths = [(51u64, 208usize), (52, 32), (53, 144)];
        let outs: Vec<_> = widths
            .iter()
            .map(|&(seed, n)| {
                let p = projection(&mut b, x, seed, (n, k), (4, group), act);
                if !biased {
                    return p;
                }
                let bias = b.parameter("bias", HostTensor::from_f32(act, &[n], &noise(seed + 10, n)).unwrap());
                b.add(p, bias).unwrap()
            })
            .collect();
        let graph = b.finish(&outs);
        cases.push(OpCase {
            name: format!("fused batched q/k/v products {act} rows {rows} k {k} group {group} bias {biased}"),
            graph: passed(&graph),
            inputs: vec![HostTensor::from_f32(act, &[rows, k], &noise(54, rows * k)).unwrap()],
            states: vec![],
            tolerance: vec![Tolerance::for_dtype(act).scaled(8.0); 3],
        });
    }
    // The add + RMSNorm in front of them computed inside their launch (the residual sum an
    // output too), with w and with 1 + w (Gemma's form). Norm weights in x's dtype: f32 ones
    // would make the norm's output f32 (MLX's promotion) and the products CUDA-core ones.
    // Gemma's width (1152, a half chunk at the end) with 1 + w, llama's form, and SmolLM2's
    // width (576: two chunks and a quarter).
    for (act, nwdt, unit, k) in [
        (DType::F16, DType::F16, true, 1152usize),
        (DType::BF16, DType::BF16, false, 768),
        (DType::F16, DType::F16, false, 576),
    ] {
        let mut b = GraphBuilder::default();
        let (sum, x) = normed_sum(&mut b, act, nwdt, k, 15, unit);
        let mut outs: Vec<_> = [(16u64, 96usize), (17, 32), (18, 32)]
            .into_iter()
            .map(|(seed, n)| projection(&mut b, x, seed, (n, k), (4, 64), act))
            .collect();
        outs.push(sum);
        let graph = one_launch(&b.finish(&outs), "add, norm and products");
        cases.push(OpCase {
            name: format!("fused add+norm+q/k/v products {act} norm w{nwdt} unit offset {unit}"),
            graph,
            inputs: vec![
                HostTensor::from_f32(act, &[1, 1, k], &noise(19, k)).unwrap(),
                HostTensor::from_f32(act, &[1, 1, k], &noise(20, k)).unwrap(),
            ],
            states: vec![],
            tolerance: [
                vec![Tolerance::for_dtype(act).scaled(4.0); 3],
                vec![Tolerance::for_dtype(act)],
            ]
            .concat(),
        });
    }
    // Routed experts' gate, up, SiLU and product at decode as one launch: two tokens, top 3 of
    // 5 experts (one chosen twice by the second token), 4-bit group 64, k past one chunk.
    for act in [DType::F16, DType::BF16] {
        let (k, n, e) = (512, 48, 5);
        let mut b = GraphBuilder::default();
        let x = b.input("x", act, &[2, 1, k]);
        let ids = b.input("ids", DType::U32, &[2, 3]);
        let y = routed_glu(&mut b, x, ids, act, (e, n, k), 41);
        let graph = one_launch(&b.finish(&[y]), "the routed GLU");
        cases.push(OpCase {
            name: format!("fused routed glu {act}"),
            graph,
            inputs: vec![
                HostTensor::from_f32(act, &[2, 1, k], &noise(43, 2 * k)).unwrap(),
                HostTensor::from_slice(&[2, 3], &[4u32, 0, 2, 1, 3, 1]).unwrap(),
            ],
            states: vec![],
            tolerance: vec![Tolerance::for_dtype(act).scaled(4.0)],
        });
    }
    // The router inside the routed GLU that reads its ids (each block routes its own pair from
    // the logits; one launch writes the ids, the weights and the GLU): two tokens whose logits
    // tie often, so the ids must agree exactly. 128 experts top 8 (ties to the higher index,
    // renormalized), 20 top 3 (ties to the lower, not renormalized), 8 top 8 (every expert).
    for (act, e, top, high, renorm) in [
        (DType::F16, 128, 8, true, true),
        (DType::BF16, 128, 8, true, true),
        (DType::F16, 20, 3, false, false),
        (DType::BF16, 8, 8, false, true),
    ] {
        let (k, n) = (512, 48);
        let mut b = GraphBuilder::default();
        let logits = b.input("logits", act, &[2, e]);
        let x = b.input("x", act, &[2, 1, k]);
        let probs = b.softmax(logits, -1).unwrap();
        let ids = b.topk_ties(probs, top, high).unwrap();
        let mut w = b.take_along_axis(probs, ids, -1).unwrap();
        if renorm {
            let total = b.sum(w, -1, true).unwrap();
            w = b.div(w, total).unwrap();
        }
        let y = routed_glu(&mut b, x, ids, act, (e, n, k), 44);
        let graph = one_launch(&b.finish(&[ids, w, y]), "the router and the routed GLU");
        let values: Vec<f32> = (0..2 * e).map(|i| ((i * 7 % 5) as f32) * 0.5).collect();
        cases.push(OpCase {
            name: format!("fused moe router in the routed glu {act} e{e} top{top} high {high} renorm {renorm}"),
            graph,
            inputs: vec![
                HostTensor::from_f32(act, &[2, e], &values).unwrap(),
                HostTensor::from_f32(act, &[2, 1, k], &noise(46, 2 * k)).unwrap(),
            ],
            states: vec![],
            tolerance: vec![
                Tolerance::for_dtype(DType::U32),
                Tolerance::for_dtype(act),
                Tolerance::for_dtype(act).scaled(4.0),
            ],
        });
    }
    // A MoE router (softmax over 128 experts, top 8 with ties to the higher index, the chosen
    // renormalized) as one launch; logits of five values, so probabilities tie often.
    for act in [DType::F16, DType::BF16] {
        let (e, k) = (128, 8);
        let mut b = GraphBuilder::default();
        let logits = b.input("logits", act, &[2, 1, e]);
        let probs = b.softmax(logits, -1).unwrap();
        let ids = b.topk_ties(probs, k, true).unwrap();
        let w = b.take_along_axis(probs, ids, -1).unwrap();
        let total = b.sum(w, -1, true).unwrap();
        let w = b.div(w, total).unwrap();
        let graph = one_launch(&b.finish(&[ids, w]), "the router");
        let values: Vec<f32> = (0..2 * e).map(|i| ((i * 7 % 5) as f32) * 0.5).collect();
        cases.push(OpCase {
            name: format!("fused moe router {act}"),
            graph,
            inputs: vec![HostTensor::from_f32(act, &[2, 1, e], &values).unwrap()],
            states: vec![],
            tolerance: vec![Tolerance::for_dtype(DType::U32), Tolerance::for_dtype(act)],
        });
    }
    // MoE's combine: k experts' outputs times their weights, summed (one launch), for decode
    // and for a prefill chunk (a thread an output, or 8 of them for k <= 8 and d a multiple of 8).
    for (act, rows, k, d) in [
        (DType::F16, 2, 8, 96),
        (DType::BF16, 2, 8, 96),
        (DType::F16, 70, 8, 96),
        (DType::BF16, 70, 8, 96),
        (DType::BF16, 70, 3, 40),
        (DType::F16, 70, 12, 40),
        (DType::F16, 70, 4, 36),
    ] {
        let mut b = GraphBuilder::default();
        let y = b.input("y", act, &[rows, 1, k, d]);
        let w = b.input("w", act, &[rows, 1, k]);
        let w1 = b.reshape(w, &[rows, 1, k, 1]).unwrap();
        let p = b.mul(y, w1).unwrap();
        let s = b.sum(p, -2, false).unwrap();
        let graph = one_launch(&b.finish(&[s]), "the combine");
        cases.push(OpCase {
            name: format!("fused moe combine {act} rows{rows} k{k} d{d}"),
            graph,
            inputs: vec![
                HostTensor::from_f32(act, &[rows, 1, k, d], &noise(51, rows * k * d)).unwrap(),
                HostTensor::from_f32(act, &[rows, 1, k], &noise(52, rows * k)).unwrap(),
            ],
            states: vec![],
            tolerance: vec![Tolerance::for_dtype(act).scaled(2.0)],
        });
    }
    // The same with dense 16-bit weights (the 0.5B model's q, k and v), k not a multiple of 256.
    for (act, wdt) in [
        (DType::F16, DType::F16),
        (DType::BF16, DType::BF16),
        (DType::F32, DType::BF16),
    ] {
        let k = 72;
        let mut b = GraphBuilder::default();
        let x = b.input("x", act, &[1, 1, k]);
        let outs: Vec<_> = [(21u64, 40usize), (22, 8), (23, 8)]
            .into_iter()
            .map(|(seed, n)| projection(&mut b, x, seed, (n, k), (0, 0), wdt))
            .collect();
        let graph = b.finish(&outs);
        let out_dtype = graph.node(graph.outputs[0]).dtype;
        cases.push(OpCase {
            name: format!("fused dense q/k/v products {act} w{wdt}"),
            graph: passed(&graph),
            inputs: vec![HostTensor::from_f32(act, &[1, 1, k], &noise(6, k)).unwrap()],
            states: vec![],
            tolerance: vec![Tolerance::for_dtype(out_dtype).scaled(4.0); 3],
        });
    }
    // Qwen2's attention inputs: the add + RMSNorm, q, k and v, and each product's bias, as one
    // launch (dense 16-bit, x staged; and 4-bit on the tensor cores), the residual sum an
    // output too; then the GLU after an add + RMSNorm over dense weights, as one launch.
    for (act, bits, k) in [
        (DType::F16, 0u32, 896usize),
        (DType::BF16, 0, 224),
        (DType::F16, 4, 512),
        (DType::BF16, 4, 256),
    ] {
        let mut b = GraphBuilder::default();
        let (sum, x) = normed_sum(&mut b, act, act, k, 61, false);
        let widths = [(62u64, 64usize), (63, 32), (64, 32)];
        let products: Vec<_> = widths
            .iter()
            .map(|&(seed, n)| projection(&mut b, x, seed, (n, k), (bits, 64), act))
            .collect();
        let mut outs: Vec<_> = products
            .iter()
            .zip(&widths)
            .map(|(&p, &(seed, n))| {
                let bias = b.parameter("bias", HostTensor::from_f32(act, &[n], &noise(seed + 10, n)).unwrap());
                b.add(p, bias).unwrap()
            })
            .collect();
        outs.push(sum);
        let graph = one_launch(&b.finish(&outs), "add, norm, products and biases");
        cases.push(OpCase {
            name: format!("fused add+norm+q/k/v products+bias {act} bits {bits} k {k}"),
            graph,
            inputs: vec![
                HostTensor::from_f32(act, &[1, 1, k], &noise(65, k)).unwrap(),
                HostTensor::from_f32(act, &[1, 1, k], &noise(66, k)).unwrap(),
            ],
            states: vec![],
            tolerance: [
                vec![Tolerance::for_dtype(act).scaled(4.0); 3],
                vec![Tolerance::for_dtype(act)],
            ]
            .concat(),
        });
        if bits != 0 {
            continue;
        }
        let mut b = GraphBuilder::default();
        let (sum, x) = normed_sum(&mut b, act, act, k, 67, true);
        let g = projection(&mut b, x, 68, (96, k), (0, 0), act);
        let g = b.silu(g).unwrap();
        let u = projection(&mut b, x, 69, (96, k), (0, 0), act);
        let y = b.mul(g, u).unwrap();
        let graph = one_launch(&b.finish(&[y, sum]), "add, norm and dense GLU");
        cases.push(OpCase {
            name: format!("fused add+norm+dense glu {act} k {k}"),
            graph,
            inputs: vec![
                HostTensor::from_f32(act, &[1, 1, k], &noise(70, k)).unwrap(),
                HostTensor::from_f32(act, &[1, 1, k], &noise(71, k)).unwrap(),
            ],
            states: vec![],
            tolerance: vec![Tolerance::for_dtype(act).scaled(8.0), Tolerance::for_dtype(act)],
        });
    }
    // Gemma's sandwich: the sublayer's output normalized (1 + w), added to the residual and the
    // sum normalized again, all inside the launch of what reads it: 4-bit q/k/v products on the
    // tensor cores (Gemma 3 1B's width), and a dense GLU with x staged.
    for (act, bits, k) in [(DType::BF16, 4u32, 1152usize), (DType::F16, 0, 896)] {
        let mut b = GraphBuilder::default();
        let h = b.input("h", act, &[1, 1, k]);
        let d = b.input("d", act, &[1, 1, k]);
        let pw = b.parameter("post", HostTensor::from_f32(act, &[k], &noise(91, k)).unwrap());
        let nw = b.parameter("norm", HostTensor::from_f32(act, &[k], &noise(92, k)).unwrap());
        let d = b.rms_norm(d, pw, 1e-6, true).unwrap();
        let sum = b.add(h, d).unwrap();
        let x = b.rms_norm(sum, nw, 1e-6, true).unwrap();
        let mut outs = if bits == 4 {
            [(93u64, 64usize), (94, 32), (95, 32)]
                .into_iter()
                .map(|(seed, n)| projection(&mut b, x, seed, (n, k), (4, 64), act))
                .collect()
        } else {
            let g = projection(&mut b, x, 96, (48, k), (0, 0), act);
            let g = b.unary(mlxcel_core::UnaryOp::GeluTanh, g).unwrap();
            let u = projection(&mut b, x, 97, (48, k), (0, 0), act);
            vec![b.mul(g, u).unwrap()]
        };
        let products = outs.len();
        outs.push(sum);
        let graph = one_launch(&b.finish(&outs), "a sandwich norm, the add, the norm and what reads it");
        cases.push(OpCase {
            name: format!("fused sandwich norm+add+norm {act} bits {bits} k {k}"),
            graph,
            inputs: vec![
                HostTensor::from_f32(act, &[1, 1, k], &noise(98, k)).unwrap(),
                HostTensor::from_f32(act, &[1, 1, k], &noise(99, k)).unwrap(),
            ],
            states: vec![],
            tolerance: [
                vec![Tolerance::for_dtype(act).scaled(8.0); products],
                vec![Tolerance::for_dtype(act)],
            ]
            .concat(),
        });
    }
    // The loads-first dense GEMVs with each count of warps splitting k (k up to 1024, 2048,
    // 4096 and past 8192, which takes a second batch), n not a multiple of a block's rows: a
    // product, and a GLU whose add + RMSNorm it computes.
    for (act, wdt, k, n) in [
        (DType::F16, DType::F16, 1152usize, 37usize),
        (DType::BF16, DType::BF16, 3008, 13),
        (DType::F16, DType::BF16, 4864, 21),
        (DType::BF16, DType::F16, 8448, 9),
    ] {
        let mut b = GraphBuilder::default();
        let x = b.input("x", act, &[1, 1, k]);
        let y = projection(&mut b, x, 81, (n, k), (0, 0), wdt);
        let graph = one_launch(&b.finish(&[y]), "a dense product");
        cases.push(OpCase {
            name: format!("dense gemv {act} w{wdt} k {k} n {n}"),
            graph,
            inputs: vec![HostTensor::from_f32(act, &[1, 1, k], &noise(82, k)).unwrap()],
            states: vec![],
            tolerance: vec![Tolerance::for_dtype(act).scaled(4.0)],
        });
        let mut b = GraphBuilder::default();
        let (sum, x) = normed_sum(&mut b, act, act, k, 83, false);
        let g = projection(&mut b, x, 84, (n, k), (0, 0), wdt);
        let g = b.unary(mlxcel_core::UnaryOp::GeluTanh, g).unwrap();
        let u = projection(&mut b, x, 85, (n, k), (0, 0), wdt);
        let y = b.mul(g, u).unwrap();
        let graph = one_launch(&b.finish(&[y, sum]), "add, norm and a dense GLU");
        cases.push(OpCase {
            name: format!("fused add+norm+dense glu {act} w{wdt} k {k} n {n}"),
            graph,
            inputs: vec![
                HostTensor::from_f32(act, &[1, 1, k], &noise(86, k)).unwrap(),
                HostTensor::from_f32(act, &[1, 1, k], &noise(87, k)).unwrap(),
            ],
            states: vec![],
            tolerance: vec![Tolerance::for_dtype(act).scaled(8.0), Tolerance::for_dtype(act)],
        });
    }
    // Tall products and a tall GLU, so each tensor-core block loops over several 16-row tiles,
    // in each group size (what MLXCEL_TC_PACK's scale order depends on).
    for (act, group) in [(DType::F16, 32usize), (DType::BF16, 64), (DType::F16, 128)] {
        let k = 1024;
        let mut b = GraphBuilder::default();
        let x = b.input("x", act, &[1, 1, k]);
        let y = projection(&mut b, x, 31, (32768, k), (4, group), act);
        let g = projection(&mut b, x, 32, (16384, k), (4, group), act);
        let g = b.silu(g).unwrap();
        let u = projection(&mut b, x, 33, (16384, k), (4, group), act);
        let h = b.mul(g, u).unwrap();
        let graph = b.finish(&[y, h]);
        cases.push(OpCase {
            name: format!("tall products {act} group {group}"),
            graph: passed(&graph),
            inputs: vec![HostTensor::from_f32(act, &[1, 1, k], &noise(34, k)).unwrap()],
            states: vec![],
            // The GLU rounds g to x's dtype before act(g) · u, so a g summed in another order
            // can land one rounding step away, amplified by u: on the H100 one f16 element of
            // 16384 was off by 0.0054 (-0.1440 against -0.1387) at 4x; 8x as for the GLU above.
            tolerance: vec![
                Tolerance::for_dtype(act).scaled(4.0),
                Tolerance::for_dtype(act).scaled(8.0),
            ],
        });
    }
    // An attention step's case: its output and both caches against the CPU's, each within
    // dt's tolerance scaled by `scales`.
    #[allow(clippy::type_complexity)]
    let step_case = |name: String,
                     (graph, inputs, states): (mlxcel_core::Graph, Vec<HostTensor>, Vec<(String, HostTensor)>),
                     dt: DType,
                     scales: [f64; 3]| OpCase {
        name,
        graph,
        inputs,
        states,
        tolerance: scales.iter().map(|&x| Tolerance::for_dtype(dt).scaled(x)).collect(),
    };
    // q, k and v's products with their rope and cache writes in the epilogue.
    for (dt, heads, k, flags, place) in PROJECTED_ROPE {
        cases.push(step_case(
            format!("q, k, v products with rope and writes {dt} {heads:?} (k, bits) {k:?} {flags:?} at {place:?}"),
            projected_rope_step(dt, heads, k, flags, place),
            dt,
            [4.0; 3],
        ));
    }
    // Per-head q and k norms inside the rope-and-write launch.
    for (dt, shape, t, unit_offset, at) in QK_NORM {
        cases.push(step_case(
            format!("qk norms in rope and write {dt} {shape:?} t={t} unit_offset {unit_offset} at {at}"),
            qk_norm_step(dt, shape, t, Some(unit_offset), at),
            dt,
            [4.0, 1.0, 1.0],
        ));
    }
    // A decode step's rope and cache writes inside its attention's split kernel, the fold
    // turned on.
    fold_rope_into_attention();
    for (dt, shape, interleaved, cap, at) in ROPE_DECODE {
        cases.push(step_case(
            format!("rope in decode attention {dt} {shape:?} interleaved {interleaved} at {at:?}"),
            rope_decode_step(dt, shape, interleaved, cap, at),
            dt,
            [4.0, 1.0, 1.0],
        ));
    }
    let cuda = match cuda {
        Ok(b) => b,
        Err(e) if !required("MLXCEL_REQUIRE_CUDA") => return eprintln!("skipping CUDA fusion cases: {e}"),
        Err(e) => panic!("{e}"),
    };
    let failures = check_cases(&cuda, &cases, |c| run_case(&CpuBackend, c));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Decode GEMV throughput on the shapes of llama-3.1-8b-4bit (4-bit, group 64, f16 x), each
/// kernel alone: a graph of L independent products over distinct weights (more bytes than L2
/// holds) replayed as one CUDA graph, timed at L and 2L so the fixed cost of a run cancels.
/// A benchmark, not a check: run with `--ignored --nocapture` on the GPU machine.
#[test]
#[ignore]
fn gemv_throughput() {
    use mlxcel_core::{Backend, CompileOptions, DType, GraphBuilder, HostTensor};
    use std::time::Instant;
    let cuda = CudaBackend::new().expect("a GPU");
    // Each layer: products of widths `ns` over its own x (so layers stay separate launches
    // while a layer's products may share one), or a GLU of two of width ns[0].
    let build = |ns: &[usize], k: usize, glu: bool, layers: usize| {
        let mut rng = mlxcel_core::rng::SplitMix64(ns[0] as u64 * 31 + k as u64);
        let mut b = GraphBuilder::default();
        let mut outs = Vec::new();
        for l in 0..layers {
            let x = b.input(&format!("x{l}"), DType::F16, &[1, 1, k]);
            let mut proj = |b: &mut GraphBuilder, n: usize| {
                let packed: Vec<u32> = (0..n * k / 8).map(|_| rng.next_u64() as u32).collect();
                let scales = rng.signed_vec(n * k / 64, 0.01);
                let biases = rng.signed_vec(n * k / 64, 0.01);
                let q = b.parameter("q", HostTensor::from_slice(&[n, k / 8], &packed).unwrap());
                let s = b.parameter("s", HostTensor::from_f32(DType::F16, &[n, k / 64], &scales).unwrap());
                let z = b.parameter("z", HostTensor::from_f32(DType::F16, &[n, k / 64], &biases).unwrap());
                b.quantized_matmul(x, q, s, z, 4, 64).unwrap()
            };
            if glu {
                let g = proj(&mut b, ns[0]);
                let g = b.silu(g).unwrap();
                let u = proj(&mut b, ns[0]);
                outs.push(b.mul(g, u).unwrap());
            } else {
                for &n in ns {
                    outs.push(proj(&mut b, n));
                }
            }
        }
        b.finish(&outs)
    };
    let time = |ns: &[usize], k: usize, glu: bool, layers: usize| {
        let graph = build(ns, k, glu, layers);
        let mut s = cuda.new_session().unwrap();
        let id = s.load(&graph, CompileOptions::default()).unwrap();
        let x = HostTensor::from_f32(DType::F16, &[1, 1, k], &noise(5, k)).unwrap();
        let xs = vec![x; layers];
        for _ in 0..3 {
            s.run(id, &xs).unwrap();
        }
        let runs = 20;
        let t = Instant::now();
        for _ in 0..runs {
            s.run(id, &xs).unwrap();
        }
        t.elapsed().as_secs_f64() / runs as f64
    };
    let r = std::env::var("MLXCEL_GEMV_R").unwrap_or_else(|_| "auto".into());
    println!("| shape (n x k) | kernel | R | µs/kernel | GB/s |");
    println!("|---|---|---|---|---|");
    for (ns, k, glu, name) in [
        (&[4096][..], 4096, false, "q/o proj"),
        (&[1024], 4096, false, "k/v proj"),
        (&[4096, 1024, 1024], 4096, false, "q+k+v (one launch)"),
        (&[14336], 4096, true, "gate+up (fused GLU)"),
        (&[4096], 14336, false, "down proj"),
        (&[128256], 4096, false, "lm head"),
    ] {
        // MLXCEL_GEMV_SHAPES="lm head,down proj" times only those (for a profiler's launch count).
        if let Ok(only) = std::env::var("MLXCEL_GEMV_SHAPES") {
            if !only.split(',').any(|s| s.trim() == name) {
                continue;
            }
        }
        let n: usize = ns.iter().sum::<usize>() * if glu { 2 } else { 1 };
        let bytes = n * k / 2 + 2 * 2 * n * k / 64;
        let layers = (256usize << 20).div_ceil(bytes).clamp(2, 64);
        let per = (time(ns, k, glu, 2 * layers) - time(ns, k, glu, layers)) / layers as f64;
        println!(
            "| {n} x {k} | {name} | {r} | {:.1} | {:.0} |",
            per * 1e6,
            bytes as f64 / per / 1e9
        );
    }
}
