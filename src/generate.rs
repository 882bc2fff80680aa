//! `mlxcel generate` and `mlxcel perplexity`.

use std::io::Write;
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use mlxcel_engine::tokenizer::Tokenizer;
use mlxcel_engine::{chat::ChatMessage, Engine, GenerateOptions, SamplerSettings};

use crate::cli::{GenerateArgs, Global, PerplexityArgs, SamplingArgs};

const DEFAULT_MAX_TOKENS: usize = 256;

enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

fn token_ids(ids: &[i64], flag: &str) -> Result<Vec<u32>> {
    ids.iter()
        .map(|&t| u32::try_from(t).map_err(|_| anyhow::anyhow!("{flag}: token id {t} is negative or too large")))
        .collect()
}

fn prompt_of(args: &GenerateArgs) -> Result<Prompt> {
    match (&args.prompt_text, &args.prompt, &args.prompt_tokens) {
        (Some(_), Some(_), _) => bail!("give the prompt once: as an argument or with -p, not both"),
        (Some(_), _, Some(_)) | (_, Some(_), Some(_)) => {
            bail!("give either a text prompt or --prompt-tokens, not both")
        }
        (Some(t), None, None) | (None, Some(t), None) => {
            ensure!(!t.is_empty(), "the prompt is empty");
            Ok(Prompt::Text(t.clone()))
        }
        (None, None, Some(ids)) => {
            ensure!(!ids.is_empty(), "--prompt-tokens is empty");
            Ok(Prompt::Tokens(token_ids(ids, "--prompt-tokens")?))
        }
        (None, None, None) => bail!("no prompt: pass it as an argument, with -p, or as --prompt-tokens"),
    }
}

fn sampler(s: &SamplingArgs) -> Result<SamplerSettings> {
    let seed = s.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    });
    let settings = SamplerSettings {
        temperature: s.temp,
        top_k: s.top_k,
        top_p: s.top_p,
        min_p: s.min_p,
        repetition_penalty: s.repetition_penalty,
        repetition_context: s.repetition_context_size,
        seed,
    };
    settings.validate()?;
    Ok(settings)
}

/// The model's tokenizer: a `--tokenizer` override, the GGUF's own, or the folder's files.
pub(crate) fn tokenizer(model: &Path, file: Option<&Path>) -> Result<Tokenizer> {
    let gguf = mlxcel_models::is_gguf(model);
    let config_dir = if gguf {
        model.parent().unwrap_or(Path::new("."))
    } else {
        model
    };
    match file {
        Some(f) => Tokenizer::from_file_with_config(f, config_dir),
        None if gguf => mlxcel_engine::gguf_tokenizer::from_gguf(&mlxcel_models::gguf::GgufFile::open(model)?),
        None => Tokenizer::from_dir(model),
    }
}

/// EOS ids from config.json, for runs without a tokenizer.
fn config_eos(dir: &Path) -> Vec<u32> {
    let config = if dir.is_dir() {
        mlxcel_models::read_config(dir).unwrap_or_default()
    } else {
        Default::default()
    };
    match &config["eos_token_id"] {
        serde_json::Value::Number(n) => n.as_u64().map(|v| vec![v as u32]).unwrap_or_default(),
        serde_json::Value::Array(a) => a.iter().filter_map(|v| v.as_u64()).map(|v| v as u32).collect(),
        _ => vec![],
    }
}

fn engine(global: &Global, dir: &Path, max_context: Option<usize>) -> Result<Engine> {
    crate::load_engine(global, dir, max_context)
}

/// Peak resident memory of this process (Linux `VmHWM`), 0 where unknown.
pub fn peak_memory_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

pub fn generate(global: &Global, args: GenerateArgs) -> Result<()> {
    let dir = global.model.as_deref().context("--model is required")?;
    let prompt = prompt_of(&args)?;
    let sampler = sampler(&args.sampling)?;
    let mut engine = engine(global, dir, args.max_context)?;
    // Text prompts need the tokenizer; token prompts use it only to print text.
    let tok = match (&prompt, tokenizer(dir, args.tokenizer.as_deref())) {
        (_, Ok(t)) => Some(t),
        (Prompt::Tokens(_), Err(_)) if args.tokenizer.is_none() => None,
        (_, Err(e)) => return Err(e),
    };
    let prompt_ids = match (&prompt, &tok) {
        (Prompt::Tokens(ids), _) => ids.clone(),
        (Prompt::Text(t), Some(tok)) if tok.has_chat_template() && !args.no_chat_template => {
            tok.encode_chat(&[ChatMessage {
                role: "user".into(),
                content: t.clone(),
            }])?
        }
        (Prompt::Text(t), Some(tok)) => tok.encode(t)?,
        (Prompt::Text(_), None) => unreachable!("text prompts fail without a tokenizer above"),
    };
    ensure!(!prompt_ids.is_empty(), "the prompt encodes to no tokens");
    let eos = match &tok {
        Some(t) => t.eos_ids().to_vec(),
        None => config_eos(dir),
    };
    // An explicit --max-tokens past the context is an error (in the engine); the default
    // shrinks to what the context leaves.
    ensure!(
        prompt_ids.len() < engine.max_context(),
        "the prompt ({} tokens) leaves no room to generate in the context of {} tokens",
        prompt_ids.len(),
        engine.max_context()
    );
    let room = engine.max_context() - prompt_ids.len();
    let max_tokens = args.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS.min(room));
    let opts = GenerateOptions {
        max_tokens,
        sampler,
        prefill_chunk: args.prefill_chunk,
    };
    let mut stream = tok.as_ref().map(|t| t.stream());
    let mut stdout = std::io::stdout().lock();
    let json = args.json;
    let result = engine.generate(&prompt_ids, &opts, &|id| eos.contains(&id), |id| {
        if let (Some(s), false) = (stream.as_mut(), json) {
            let piece = s.push(id)?;
            stdout.write_all(piece.as_bytes())?;
            stdout.flush()?;
        }
        Ok(true)
    })?;
    match (stream.as_mut(), json) {
        (Some(s), false) => writeln!(stdout, "{}", s.finish()?)?,
        // Without a tokenizer there is no text: the ids are the output.
        (None, false) => {
            let ids: Vec<String> = result.tokens.iter().map(u32::to_string).collect();
            writeln!(stdout, "{}", ids.join(","))?
        }
        _ => {}
    }
    let text = match &tok {
        Some(t) => t.decode(&result.tokens)?,
        None => String::new(),
    };
    let peak = peak_memory_bytes();
    let counts = crate::trace::report(&engine)?;
    if json {
        let obj = serde_json::json!({
            "prompt_tokens": prompt_ids,
            "tokens": result.tokens,
            "text": text,
            "finish_reason": result.finish_reason.as_str(),
            "prompt_tps": result.prompt_tps,
            "decode_tps": result.decode_tps,
            "peak_memory_bytes": peak,
        });
        let obj = crate::trace::merge(obj, crate::trace::json_fields(&engine, counts));
        writeln!(stdout, "{obj}")?;
    }
    eprintln!(
        "prompt: {} tokens, {:.1} tok/s | generation: {} tokens, {:.1} tok/s | peak memory: {:.2} GB",
        prompt_ids.len(),
        result.prompt_tps,
        result.tokens.len(),
        result.decode_tps,
        peak as f64 / 1e9
    );
    Ok(())
}

pub fn perplexity(global: &Global, args: PerplexityArgs) -> Result<()> {
    let dir = global.model.as_deref().context("--model is required")?;
    let tokens = match (&args.tokens, &args.file) {
        (Some(_), Some(_)) => bail!("give either --tokens or --file, not both"),
        (None, None) => bail!("perplexity needs --tokens or --file"),
        (Some(ids), None) => token_ids(ids, "--tokens")?,
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            let ids = tokenizer(dir, args.tokenizer.as_deref())?.encode(&text)?;
            ensure!(
                ids.len() >= 2,
                "{} encodes to {} token(s); perplexity needs at least two",
                path.display(),
                ids.len()
            );
            ids
        }
    };
    let mut engine = engine(global, dir, args.max_context)?;
    let nll = engine.perplexity(&tokens, args.prefill_chunk)?;
    let mean = nll.iter().sum::<f64>() / nll.len() as f64;
    let ppl = mean.exp();
    if crate::trace::dot_path(global).is_some() {
        crate::trace::write_dot(&engine.decode_graph(&SamplerSettings::default())?, global)?;
    }
    let counts = crate::trace::report(&engine)?;
    if args.json {
        let obj = serde_json::json!({ "tokens": tokens, "nll": nll, "mean_nll": mean, "ppl": ppl });
        println!(
            "{}",
            crate::trace::merge(obj, crate::trace::json_fields(&engine, counts))
        );
    } else {
        println!("{} tokens, mean nll {mean:.4}, perplexity {ppl:.4}", tokens.len());
    }
    Ok(())
}
