//! Raw command-line flags (clap). `main.rs` turns them into validated settings.

use std::path::PathBuf;

use anyhow::{ensure, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};

/// `serve`'s positions per KV block by default (also what `bench --batch` pages with).
pub const DEFAULT_BLOCK_SIZE: usize = 16;

#[derive(Parser)]
#[command(
    name = "mlxcel",
    version,
    about = "Run large language models on NVIDIA GPUs and the CPU"
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// Options every model command takes, before or after the subcommand.
#[derive(Args, Clone)]
pub struct Global {
    /// Model folder (config.json, safetensors, tokenizer files).
    #[arg(short = 'm', long, global = true)]
    pub model: Option<PathBuf>,
    /// Where to run.
    #[arg(long, global = true, value_enum, default_value_t = Device::Auto)]
    pub device: Device,
    /// Dtype policy: auto, native, f16, bf16 or f32 [default: MLXCEL_DTYPE, else the `dtype`
    /// key of mlxcel.toml beside the model, else auto (f32 activations on the CPU, f16 on CUDA)]
    #[arg(long, global = true)]
    pub dtype: Option<String>,
    /// Write the decode step graph as Graphviz DOT (also MLXCEL_EXPORT_DECODE_DOT=FILE).
    #[arg(long, global = true, value_name = "FILE")]
    pub dump_graph: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Device {
    /// CUDA when available, else the CPU.
    Auto,
    Cpu,
    Cuda,
}

#[derive(Subcommand)]
pub enum Command {
    /// Generate text from a prompt (streams to stdout; stats to stderr).
    Generate(GenerateArgs),
    /// Per-token negative log-likelihood and perplexity of a text or token sequence.
    Perplexity(PerplexityArgs),
    /// Run a tiny random-weight decoder through the engine (no checkpoint needed).
    Demo(DemoArgs),
    /// Write a GGUF file or a model folder as an mlx-lm model folder (lossless unless --quantize).
    Convert(ConvertArgs),
    /// Prefill and decode speed, on a model or on random weights in a preset's shape.
    Bench(BenchArgs),
    /// Write a preset's random weights as an mlx-lm model folder (what `bench --preset` runs).
    Synth(SynthArgs),
    /// An OpenAI-compatible HTTP server (chat and text completions, streaming, batching).
    Serve(ServeArgs),
}

#[derive(Args)]
pub struct ServeArgs {
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// 0 picks a free port (printed on stderr).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on every API request.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Sequences decoded together per step.
    #[arg(long, default_value_t = 64)]
    pub max_batch_size: usize,
    /// KV cache size in tokens, shared by all sequences [default: batch × context, at most 65536]
    #[arg(long)]
    pub max_kv_tokens: Option<usize>,
    /// Largest prompt + completion per request; default: the model's maximum.
    #[arg(long)]
    pub max_context: Option<usize>,
    /// Requests running or waiting before new ones get 429.
    #[arg(long, default_value_t = 256)]
    pub max_queue: usize,
    /// Prompt tokens per prefill chunk (rounded down to whole KV blocks).
    #[arg(long, default_value_t = 256)]
    pub prefill_chunk: usize,
    /// Prompt tokens a step may prefill, in equal chunks of several requests run as one batch
    /// (at least one chunk).
    #[arg(long, default_value_t = 2048)]
    pub max_prefill_tokens: usize,
    /// Positions per KV block.
    #[arg(long, default_value_t = DEFAULT_BLOCK_SIZE)]
    pub block_size: usize,
    /// Step graphs kept planned (each shape of step has its own buffers; the least recently
    /// used is unloaded past this).
    #[arg(long, default_value_t = mlxcel_engine::paged::DEFAULT_MAX_GRAPHS)]
    pub max_step_graphs: usize,
    /// Largest request body.
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Use this tokenizer.json instead of the model's own (the folder's files or the GGUF's).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
}

#[derive(Args)]
pub struct BenchArgs {
    /// Random weights in this model's shape and layout (e.g. llama-3.1-8b-4bit), instead of -m.
    #[arg(long)]
    pub preset: Option<String>,
    /// Print the preset names, one per line, and exit.
    #[arg(long)]
    pub list_presets: bool,
    /// Seed of the preset's random weights (`mlxcel synth --seed` writes the same ones)
    /// [default: 0]
    #[arg(long)]
    pub seed: Option<u64>,
    /// Prompt length: random token ids, prefilled once per run.
    #[arg(short = 'p', long, default_value_t = 512)]
    pub prompt: usize,
    /// Tokens generated per run (greedy; end-of-sequence ignored).
    #[arg(
        short = 'g',
        long = "gen",
        short_alias = 'n',
        alias = "max-tokens",
        default_value_t = 128
    )]
    pub gen: usize,
    /// Timed runs, after one warm-up run.
    #[arg(short = 'r', long, default_value_t = 3)]
    pub runs: usize,
    /// Tokens per prefill step.
    #[arg(long, default_value_t = 512)]
    pub prefill_chunk: usize,
    /// Print one JSON object on stdout instead of the table (and draw no progress bars).
    #[arg(long)]
    pub json: bool,
    /// Build the decode step graph and report its node and AsType counts without running it;
    /// with --device cuda this needs no GPU (the graph is the one CUDA would run).
    #[arg(long)]
    pub graph_only: bool,
    /// The batched decode step `serve` runs, for this many rows (the paged KV cache, 16-position
    /// blocks): timed over -g steps from position -p (as if prefilled), or counted with
    /// --graph-only; instead of the single-sequence step.
    #[arg(long)]
    pub batch: Option<usize>,
    /// With --preset: norm weights stored as float32 instead of bfloat16.
    #[arg(long)]
    pub f32_norms: bool,
}

#[derive(Args)]
pub struct SynthArgs {
    /// The preset to write (`mlxcel bench --list-presets` lists them).
    #[arg(long)]
    pub preset: String,
    /// The folder to write (config.json, safetensors, a byte-level tokenizer).
    #[arg(long)]
    pub out: PathBuf,
    /// Seed of the random weights; `mlxcel bench --preset NAME --seed S` runs the same ones.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write into --out even if it already holds files (old weight files are removed).
    #[arg(long)]
    pub force: bool,
}

#[derive(Args)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temp: f32,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// 0 disables.
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// Recent tokens the repetition penalty looks at.
    #[arg(long, default_value_t = 20)]
    pub repetition_context_size: usize,
    /// Seed for reproducible sampling.
    #[arg(long)]
    pub seed: Option<u64>,
}

#[derive(Args)]
pub struct GenerateArgs {
    /// The prompt (or use -p).
    pub prompt_text: Option<String>,
    #[arg(short = 'p', long = "prompt")]
    pub prompt: Option<String>,
    /// Token ids instead of text, used exactly as given (no BOS, no template).
    #[arg(long, value_delimiter = ',')]
    pub prompt_tokens: Option<Vec<i64>>,
    /// Tokens to generate [default: 256, or what the context leaves]
    #[arg(short = 'n', long)]
    pub max_tokens: Option<usize>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Largest context (prompt + generated) to allow; default: the model's maximum.
    #[arg(long)]
    pub max_context: Option<usize>,
    /// Send the raw prompt, without the model's chat template.
    #[arg(long)]
    pub no_chat_template: bool,
    /// Use this tokenizer.json instead of the model folder's.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Tokens per prefill step.
    #[arg(long, default_value_t = 512)]
    pub prefill_chunk: usize,
    /// Print one JSON object on stdout instead of streaming text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct PerplexityArgs {
    /// Token ids, used as given.
    #[arg(long, value_delimiter = ',')]
    pub tokens: Option<Vec<i64>>,
    /// A text file, tokenized as it is (BOS only if the tokenizer asks for one, no template).
    #[arg(long)]
    pub file: Option<PathBuf>,
    #[arg(long)]
    pub max_context: Option<usize>,
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    #[arg(long, default_value_t = 512)]
    pub prefill_chunk: usize,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct DemoArgs {
    /// Decoder layers.
    #[arg(long, default_value_t = 2)]
    pub layers: usize,
    /// Hidden size (a multiple of 32 and of --heads).
    #[arg(long, default_value_t = 128)]
    pub dim: usize,
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    #[arg(long, default_value_t = 2)]
    pub kv_heads: usize,
    #[arg(long, default_value_t = 512)]
    pub vocab: usize,
    /// Tokens to generate.
    #[arg(short = 'n', long, default_value_t = 16)]
    pub steps: usize,
    /// Activation dtype (f32, f16 or bf16); weights stay as stored (4-bit, bf16 scales).
    #[arg(long, default_value = "f32")]
    pub activations: String,
    /// Prompt token ids, comma separated.
    #[arg(long, default_value = "1,2,3,4,5,6,7,8")]
    pub prompt_tokens: String,
    /// Write the decode step graph as Graphviz DOT.
    #[arg(long)]
    pub export_dot: Option<PathBuf>,
}

#[derive(Args)]
pub struct ConvertArgs {
    /// The model to convert: a .gguf file or a safetensors model folder.
    #[arg(long)]
    pub from: PathBuf,
    /// The folder to write (config.json, model.safetensors, tokenizer files).
    #[arg(long)]
    pub out: PathBuf,
    /// Requantize every linear and embedding weight to this many bits (4 or 8); lossy.
    #[arg(long, value_name = "BITS")]
    pub quantize: Option<u32>,
    /// Group size for --quantize: 32, 64 or 128 [default: 64]
    #[arg(long)]
    pub group_size: Option<usize>,
    /// Write into --out even if it already holds files (stale weight shards are removed).
    #[arg(long)]
    pub force: bool,
}

/// Fails unless every `(value, flag)` given is at least 1 (flags left unset are `None`).
pub fn at_least_one(flags: &[(Option<usize>, &str)]) -> Result<()> {
    for &(value, flag) in flags {
        if let Some(v) = value {
            ensure!(v > 0, "{flag} {v}: must be at least 1");
        }
    }
    Ok(())
}

/// Fails unless `value` of `flag` is 1 to `most`.
pub fn one_to(flag: &str, value: usize, most: usize) -> Result<()> {
    ensure!((1..=most).contains(&value), "{flag} {value}: must be 1 to {most}");
    Ok(())
}
