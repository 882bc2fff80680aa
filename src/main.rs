//! The `mlxcel` command line.

mod bench;
mod cli;
mod convert;
mod demo;
mod generate;
mod progress;
mod serve;
mod synth;
mod traffic;

use anyhow::{bail, Result};
use clap::Parser;
use mlxcel_core::{Backend, DType};

use cli::{Cli, Command, Device};

pub fn backend(device: Device) -> Result<Box<dyn Backend>> {
    match device {
        Device::Cpu => Ok(Box::new(mlxcel_cpu::CpuBackend)),
        Device::Cuda => Ok(Box::new(mlxcel_cuda::CudaBackend::new()?)),
        Device::Auto => match mlxcel_cuda::CudaBackend::new() {
            Ok(cuda) => Ok(Box::new(cuda)),
            Err(_) => Ok(Box::new(mlxcel_cpu::CpuBackend)),
        },
    }
}

/// The activation dtype for `--dtype` on `backend`. On the CPU, `auto` is f32: the CPU is the
/// oracle, computing in f32 with weights widened inside kernels.
pub fn compute_dtype(flag: &str, backend: &str) -> Result<DType> {
    match (flag, backend) {
        ("auto" | "f32" | "float32", "cpu") => Ok(DType::F32),
        ("native" | "f16" | "float16" | "bf16" | "bfloat16", _) => {
            bail!("--dtype {flag} is not available yet (it arrives with single-dtype decode); use auto or f32")
        }
        ("auto" | "f32" | "float32", _) => Ok(DType::F32),
        _ => bail!("--dtype {flag}: expected auto, native, f16, bf16 or f32"),
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Generate(args) => generate::generate(&cli.global, args),
        Command::Perplexity(args) => generate::perplexity(&cli.global, args),
        Command::Demo(args) => demo::command(&cli.global, args),
        Command::Convert(args) => convert::command(args),
        Command::Bench(args) => bench::command(&cli.global, args),
        Command::Serve(args) => serve::command(&cli.global, args),
        Command::Synth(args) => synth::command(args),
    }
}

fn main() {
    if let Err(e) = run(Cli::parse()) {
        eprintln!("mlxcel: error: {e:#}");
        std::process::exit(1);
    }
}
