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

#[test]
fn every_kernel_compiles_to_ptx_for_hopper() {
    match CudaBackend::compile_kernels("sm_90") {
        Ok(bytes) => assert!(bytes > 1000, "suspiciously small PTX ({bytes} bytes)"),
        Err(e) if !required("MLXCEL_REQUIRE_NVRTC") && !required("MLXCEL_REQUIRE_CUDA") => {
            eprintln!("skipping the kernel compile check: {e}");
        }
        Err(e) => panic!("{e}"),
    }
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
