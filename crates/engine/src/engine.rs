//! The generation loop: one session per model, step graphs planned once per (head, length)
//! and replayed; the KV cache grows in chunks; prefill runs in chunks.

use std::collections::HashMap;
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use mlxcel_core::passes::{default_passes, run_passes};
use mlxcel_core::{Backend, CompileOptions, DType, GraphBuilder, GraphId, HostTensor, Session};
use mlxcel_models::{StepInputs, Transformer};

use crate::sampler::{self, SamplerSettings};

/// Cache capacity grows in multiples of this many positions.
const CACHE_CHUNK: usize = 256;

/// What a step graph computes after the model.
#[derive(Clone, Debug, PartialEq)]
enum Head {
    /// Nothing: a prefill chunk that only fills the cache.
    None,
    Sample(SamplerSettings),
    /// Per-position negative log-likelihood of given targets.
    Nll,
}

#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampler: SamplerSettings,
    /// Tokens per prefill step.
    pub prefill_chunk: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub finish_reason: FinishReason,
    pub prompt_tps: f64,
    pub decode_tps: f64,
}

pub struct Engine {
    model: Transformer,
    backend: Box<dyn Backend>,
    session: Box<dyn Session>,
    dtype: DType,
    capacity: usize,
    max_context: usize,
    graphs: HashMap<(String, usize), GraphId>,
    /// Tokens currently in the cache.
    position: usize,
}

impl Engine {
    pub fn new(
        model: Transformer,
        backend: Box<dyn Backend>,
        dtype: DType,
        max_context: Option<usize>,
    ) -> Result<Engine> {
        let max_context = max_context.unwrap_or(model.spec.max_position);
        ensure!(max_context > 0, "--max-context must be positive");
        let session = backend.new_session()?;
        Ok(Engine {
            model,
            backend,
            session,
            dtype,
            capacity: 0,
            max_context,
            graphs: HashMap::new(),
            position: 0,
        })
    }

    pub fn model(&self) -> &Transformer {
        &self.model
    }

    pub fn max_context(&self) -> usize {
        self.max_context
    }

    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    pub fn memory(&self) -> mlxcel_core::MemoryReport {
        self.session.memory()
    }

    /// Makes room for `needed` positions, keeping what the cache holds.
    fn ensure_capacity(&mut self, needed: usize) -> Result<()> {
        if needed > self.max_context {
            bail!(
                "{needed} tokens exceed the context of {} (see --max-context)",
                self.max_context
            );
        }
        if needed <= self.capacity {
            return Ok(());
        }
        let old = std::mem::replace(&mut self.session, self.backend.new_session()?);
        self.graphs.clear();
        self.capacity = needed
            .div_ceil(CACHE_CHUNK)
            .saturating_mul(CACHE_CHUNK)
            .min(self.max_context);
        if self.position > 0 {
            // Loading any step graph declares the bigger states; then copy the old rows over.
            self.graph(&Head::None, 1)?;
            for l in 0..self.model.spec.layers {
                for kind in ["k", "v"] {
                    let name = format!("layers.{l}.{kind}_cache");
                    let grown = grow(&old.read_state(&name)?, self.capacity)?;
                    self.session.write_state(&name, &grown)?;
                }
            }
        }
        Ok(())
    }

    fn graph(&mut self, head: &Head, t: usize) -> Result<GraphId> {
        let key = (format!("{head:?}"), t);
        if let Some(&id) = self.graphs.get(&key) {
            return Ok(id);
        }
        let mut b = GraphBuilder::default();
        let inputs = StepInputs {
            tokens: b.input("tokens", DType::I32, &[1, t]),
            positions: b.input("positions", DType::I32, &[t]),
            offset: b.input("offset", DType::I32, &[]),
            kv_len: mlxcel_core::NodeId(0), // set below
            tokens_len: t,
            capacity: self.capacity,
            dtype: self.dtype,
            last_only: !matches!(head, Head::Nll),
        };
        let kv_len = b.add_scalar(inputs.offset, t as f32)?;
        let inputs = StepInputs { kv_len, ..inputs };
        let logits = self.model.forward(&mut b, &inputs)?;
        let outputs = match head {
            Head::None => vec![],
            Head::Sample(s) => {
                let vocab = self.model.spec.vocab;
                let logits = b.reshape(logits, &[1, vocab])?;
                vec![sampler::build(&mut b, logits, s)?.0]
            }
            Head::Nll => {
                let vocab = self.model.spec.vocab;
                let logits = b.reshape(logits, &[t, vocab])?;
                let logits = b.astype(logits, DType::F32);
                let targets = b.input("targets", DType::I32, &[t, 1]);
                let lse = b.reduce(mlxcel_core::ReduceOp::LogSumExp, logits, -1, false)?;
                let picked = b.take_along_axis(logits, targets, -1)?;
                let picked = b.reshape(picked, &[t])?;
                vec![b.sub(lse, picked)?]
            }
        };
        let graph = run_passes(&b.finish(&outputs), &default_passes())?;
        let id = self.session.load(&graph, CompileOptions::default())?;
        self.graphs.insert(key, id);
        Ok(id)
    }

    /// Runs `tokens` at the current position; returns the graph's outputs.
    fn step(&mut self, head: &Head, tokens: &[u32], extra: Vec<HostTensor>) -> Result<Vec<HostTensor>> {
        let t = tokens.len();
        self.ensure_capacity(self.position + t)?;
        let id = self.graph(head, t)?;
        let ids: Vec<i32> = tokens.iter().map(|&x| x as i32).collect();
        let positions: Vec<i32> = (self.position..self.position + t).map(|p| p as i32).collect();
        let mut inputs = vec![
            HostTensor::from_slice(&[1, t], &ids)?,
            HostTensor::from_slice(&[t], &positions)?,
            HostTensor::from_slice(&[], &[self.position as i32])?,
        ];
        inputs.extend(extra);
        let out = self.session.run(id, &inputs)?;
        self.position += t;
        Ok(out)
    }

    fn sampler_inputs(s: &SamplerSettings, counter: u32, history: &[u32]) -> Result<Vec<HostTensor>> {
        let mut extra = Vec::new();
        if !s.is_greedy() {
            extra.push(HostTensor::from_slice(&[], &[counter])?);
        }
        if s.uses_penalty() {
            let w = s.repetition_context;
            let recent = &history[history.len().saturating_sub(w)..];
            let mut ids = vec![-1i32; w];
            for (d, &t) in ids.iter_mut().zip(recent) {
                *d = t as i32;
            }
            extra.push(HostTensor::from_slice(&[w, 1], &ids)?);
        }
        Ok(extra)
    }

    /// Generates from `prompt` (token ids, used as given). `on_token` sees each new token and
    /// returns false to stop early.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        opts: &GenerateOptions,
        is_eos: &dyn Fn(u32) -> bool,
        mut on_token: impl FnMut(u32) -> Result<bool>,
    ) -> Result<Generation> {
        ensure!(!prompt.is_empty(), "the prompt is empty");
        opts.sampler.validate()?;
        ensure!(opts.prefill_chunk > 0, "the prefill chunk must be positive");
        let vocab = self.model.spec.vocab;
        if let Some(bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
            bail!("prompt token {bad} is outside the vocabulary 0..{vocab}");
        }
        let total = prompt.len() + opts.max_tokens;
        if total > self.max_context {
            bail!(
                "the prompt ({} tokens) plus --max-tokens {} exceeds the context of {} tokens",
                prompt.len(),
                opts.max_tokens,
                self.max_context
            );
        }
        self.position = 0;
        self.ensure_capacity(total.max(1))?;
        let head = Head::Sample(opts.sampler.clone());
        let mut history = prompt.to_vec();
        let mut generated = Vec::new();
        if opts.max_tokens == 0 {
            return Ok(Generation {
                tokens: generated,
                finish_reason: FinishReason::Length,
                prompt_tps: 0.0,
                decode_tps: 0.0,
            });
        }
        let start = Instant::now();
        let chunks: Vec<&[u32]> = prompt.chunks(opts.prefill_chunk).collect();
        for chunk in &chunks[..chunks.len() - 1] {
            self.step(&Head::None, chunk, vec![])?;
        }
        let extra = Self::sampler_inputs(&opts.sampler, 0, &history)?;
        let mut next = self.step(&head, chunks[chunks.len() - 1], extra)?[0].to_vec::<u32>()?[0];
        let prompt_s = start.elapsed().as_secs_f64();
        let decode_start = Instant::now();
        let mut finish = FinishReason::Length;
        loop {
            if is_eos(next) {
                finish = FinishReason::Stop;
                break;
            }
            generated.push(next);
            history.push(next);
            if !on_token(next)? {
                finish = FinishReason::Stop;
                break;
            }
            if generated.len() == opts.max_tokens {
                break;
            }
            let extra = Self::sampler_inputs(&opts.sampler, generated.len() as u32, &history)?;
            next = self.step(&head, &[next], extra)?[0].to_vec::<u32>()?[0];
        }
        let decode_s = decode_start.elapsed().as_secs_f64();
        let decode_steps = generated.len().saturating_sub(1) + usize::from(finish == FinishReason::Stop);
        Ok(Generation {
            tokens: generated,
            finish_reason: finish,
            prompt_tps: prompt.len() as f64 / prompt_s.max(1e-9),
            decode_tps: if decode_steps > 0 {
                decode_steps as f64 / decode_s.max(1e-9)
            } else {
                0.0
            },
        })
    }

    /// `nll[i] = -ln p(tokens[i+1] | tokens[..=i])`, teacher-forced in prefill chunks.
    pub fn perplexity(&mut self, tokens: &[u32], chunk: usize) -> Result<Vec<f64>> {
        ensure!(
            tokens.len() >= 2,
            "perplexity needs at least two tokens, got {}",
            tokens.len()
        );
        ensure!(chunk > 0, "the prefill chunk must be positive");
        let vocab = self.model.spec.vocab;
        if let Some(bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            bail!("token {bad} is outside the vocabulary 0..{vocab}");
        }
        self.position = 0;
        self.ensure_capacity(tokens.len())?;
        let mut nll = Vec::with_capacity(tokens.len() - 1);
        let inputs = &tokens[..tokens.len() - 1];
        for (c, part) in inputs.chunks(chunk).enumerate() {
            let start = c * chunk;
            let targets: Vec<i32> = tokens[start + 1..start + 1 + part.len()]
                .iter()
                .map(|&t| t as i32)
                .collect();
            let targets = HostTensor::from_slice(&[part.len(), 1], &targets)?;
            let out = self.step(&Head::Nll, part, vec![targets]).context("perplexity step")?;
            nll.extend(out[0].to_f64_vec());
        }
        Ok(nll)
    }
}

/// `cache [B, H, S, D]` copied into a zeroed `[B, H, capacity, D]`.
fn grow(cache: &HostTensor, capacity: usize) -> Result<HostTensor> {
    let s = &cache.shape;
    let (outer, old, row) = (s[0] * s[1], s[2], s[3] * cache.dtype.size());
    let mut bytes = vec![0u8; outer * capacity * row];
    for o in 0..outer {
        let src = &cache.bytes()[o * old * row..(o + 1) * old * row];
        bytes[o * capacity * row..o * capacity * row + old * row].copy_from_slice(src);
    }
    let data = mlxcel_core::tensor::Storage::from_vec(bytes);
    Ok(HostTensor::from_bytes(
        cache.dtype,
        vec![s[0], s[1], capacity, s[3]],
        data,
    )?)
}
