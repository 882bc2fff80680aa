//! The `mlxcel` command line.

mod demo;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use mlxcel_core::{Backend, DType};

#[derive(Parser)]
#[command(
    name = "mlxcel",
    version,
    about = "Run large language models on NVIDIA GPUs and the CPU"
)]
struct Cli {
    /// Where to run.
    #[arg(long, global = true, value_enum, default_value_t = Device::Auto)]
    device: Device,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Device {
    /// CUDA when available, else the CPU.
    Auto,
    Cpu,
    Cuda,
}

#[derive(Subcommand)]
enum Command {
    /// Run a tiny random-weight decoder through the engine (prefill, then greedy decode).
    Demo {
        /// Decoder layers.
        #[arg(long, default_value_t = 2)]
        layers: usize,
        /// Hidden size (a multiple of 32 and of --heads).
        #[arg(long, default_value_t = 128)]
        dim: usize,
        #[arg(long, default_value_t = 4)]
        heads: usize,
        #[arg(long, default_value_t = 2)]
        kv_heads: usize,
        #[arg(long, default_value_t = 512)]
        vocab: usize,
        /// Tokens to generate.
        #[arg(short = 'n', long, default_value_t = 16)]
        steps: usize,
        /// Activation dtype (f32, f16 or bf16); weights stay as stored (4-bit, bf16 scales).
        #[arg(long, default_value = "f32")]
        dtype: String,
        /// Prompt token ids, comma separated.
        #[arg(long, default_value = "1,2,3,4,5,6,7,8")]
        prompt_tokens: String,
        /// Write the decode step graph as Graphviz DOT.
        #[arg(long)]
        export_dot: Option<std::path::PathBuf>,
    },
}

fn backend(device: Device) -> Result<Box<dyn Backend>> {
    match device {
        Device::Cpu => Ok(Box::new(mlxcel_cpu::CpuBackend)),
        Device::Cuda => Ok(Box::new(mlxcel_cuda::CudaBackend::new()?)),
        Device::Auto => match mlxcel_cuda::CudaBackend::new() {
            Ok(cuda) => Ok(Box::new(cuda)),
            Err(_) => Ok(Box::new(mlxcel_cpu::CpuBackend)),
        },
    }
}

fn parse_ids(s: &str) -> Result<Vec<i32>> {
    s.split(',')
        .map(|t| {
            t.trim()
                .parse::<i32>()
                .with_context(|| format!("bad token id {t:?} in --prompt-tokens"))
        })
        .collect()
}

fn run(cli: Cli) -> Result<()> {
    let backend = backend(cli.device)?;
    match cli.command {
        Command::Demo {
            layers,
            dim,
            heads,
            kv_heads,
            vocab,
            steps,
            dtype,
            prompt_tokens,
            export_dot,
        } => {
            let activations = match DType::parse(&dtype) {
                Some(d) if d.is_float() => d,
                _ => bail!("--dtype {dtype}: expected f32, f16 or bf16"),
            };
            let prompt = parse_ids(&prompt_tokens)?;
            if let Some(bad) = prompt.iter().find(|&&t| t < 0 || t as usize >= vocab) {
                bail!("prompt token {bad} is outside the vocabulary 0..{vocab}");
            }
            if heads == 0 || kv_heads == 0 || layers == 0 || dim == 0 {
                bail!("--layers, --dim, --heads and --kv-heads must be positive");
            }
            let capacity = prompt.len() + steps;
            let config = demo::DemoConfig {
                layers,
                dim,
                heads,
                kv_heads,
                vocab,
                capacity,
                activations,
            };
            let report = demo::run(&config, backend.as_ref(), &prompt, steps)?;
            if let Some(path) = export_dot {
                std::fs::write(&path, mlxcel_core::stats::to_dot(&report.decode_graph))
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            demo::print_report(&report);
        }
    }
    Ok(())
}

fn main() {
    if let Err(e) = run(Cli::parse()) {
        eprintln!("mlxcel: error: {e:#}");
        std::process::exit(1);
    }
}
