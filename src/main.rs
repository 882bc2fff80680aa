//! The `mlxcel` command line.

mod bench;
mod cli;
mod convert;
mod demo;
mod dtype;
mod generate;
mod progress;
mod serve;
mod synth;
mod trace;
mod traffic;

use std::path::Path;

use anyhow::Result;
use clap::Parser;
use mlxcel_core::Backend;
use mlxcel_engine::Engine;

use cli::{Cli, Command, Device, Global};

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

/// An engine for the model at `path` on `--device`, under the `--dtype` policy (flag,
/// `MLXCEL_DTYPE`, `mlxcel.toml`, default), with dtype tracing set up from the environment.
pub fn load_engine(global: &Global, path: &Path, max_context: Option<usize>) -> Result<Engine> {
    let backend = backend(global.device)?;
    let (policy, _) = dtype::resolve(global.dtype.as_deref(), Some(path))?;
    let (model, plan) = progress::load_model(path, policy, backend.name())?;
    if let Some(n) = max_context.filter(|&n| n > model.spec.max_position) {
        eprintln!(
            "mlxcel: warning: --max-context {n} is past the {} positions the model was trained on",
            model.spec.max_position
        );
    }
    let mut engine = Engine::for_plan(model, backend, &plan, max_context)?;
    trace::configure(&mut engine, global);
    Ok(engine)
}

fn run(cli: Cli) -> Result<()> {
    trace::check_dot_path(&cli.global)?;
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
