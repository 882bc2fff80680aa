//! The generation loop: one session per model, step graphs planned once per (head, length)
//! and replayed; the KV cache grows in chunks; prefill runs in chunks.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use mlxcel_core::passes::{default_passes, run_passes};
use mlxcel_core::stats::{self, GraphStats};
use mlxcel_core::{Backend, BuilderOptions, CompileOptions, DType, Graph, GraphBuilder, GraphId, HostTensor, Session};
use mlxcel_models::{DTypePlan, StepInputs, Transformer};

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

/// How step graphs are typed: the activation dtype, the builder's promotion options and the
/// `--dtype` policy they came from (for reports).
#[derive(Clone, Copy, Debug)]
pub struct GraphDType {
    pub activations: DType,
    pub options: BuilderOptions,
    pub policy: &'static str,
}

/// One step graph the engine built, with its statistics (see `MLXCEL_TRACE_DTYPE`).
#[derive(Clone, Debug)]
pub struct StepGraphStats {
    /// `decode`, `prefill`, `prefill+sample` or `nll`.
    pub kind: &'static str,
    pub tokens: usize,
    pub capacity: usize,
    pub stats: GraphStats,
    /// Times it ran (counted only while tracing).
    pub runs: usize,
}

pub struct Engine {
    model: Transformer,
    backend: Box<dyn Backend>,
    session: Box<dyn Session>,
    dtype: GraphDType,
    capacity: usize,
    max_context: usize,
    graphs: HashMap<(String, usize), GraphId>,
    /// Tokens currently in the cache.
    position: usize,
    /// Every step graph built, in order; `stats_of[id]` indexes it.
    built: Vec<StepGraphStats>,
    stats_of: HashMap<GraphId, usize>,
    trace: bool,
    export_dot: Option<PathBuf>,
}

impl Engine {
    pub fn new(
        model: Transformer,
        backend: Box<dyn Backend>,
        dtype: DType,
        max_context: Option<usize>,
    ) -> Result<Engine> {
        let dtype = GraphDType {
            activations: dtype,
            options: BuilderOptions::default(),
            policy: "fixed",
        };
        Engine::with_dtype(model, backend, dtype, max_context)
    }

    /// An engine for `model` loaded under `plan` (see `mlxcel_models::load_for`).
    pub fn for_plan(
        model: Transformer,
        backend: Box<dyn Backend>,
        plan: &DTypePlan,
        max_context: Option<usize>,
    ) -> Result<Engine> {
        let dtype = GraphDType {
            activations: plan.activation_dtype(&model),
            options: plan.builder_options(),
            policy: plan.policy.name(),
        };
        Engine::with_dtype(model, backend, dtype, max_context)
    }

    pub fn with_dtype(
        model: Transformer,
        backend: Box<dyn Backend>,
        dtype: GraphDType,
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
            built: Vec::new(),
            stats_of: HashMap::new(),
            trace: false,
            export_dot: None,
        })
    }

    pub fn graph_dtype(&self) -> GraphDType {
        self.dtype
    }

    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// Counts every run of every step graph (for `MLXCEL_TRACE_DTYPE`); off, nothing is
    /// done per step beyond running it.
    pub fn set_trace(&mut self, on: bool) {
        self.trace = on;
    }

    /// Writes each decode step graph the engine builds to `path` as Graphviz DOT.
    pub fn set_export_dot(&mut self, path: Option<PathBuf>) {
        self.export_dot = path;
    }

    /// Every step graph built so far, with statistics (computed once per graph).
    pub fn step_graphs(&self) -> &[StepGraphStats] {
        &self.built
    }

    /// `(AsType, nodes)` of the decode step graph, the largest if several were built.
    pub fn decode_counts(&self) -> Option<(usize, usize)> {
        let decode = self.built.iter().filter(|g| g.kind == "decode");
        let astype = decode.clone().map(|g| g.stats.astype.len()).max()?;
        let nodes = decode.map(|g| g.stats.nodes).max()?;
        Some((astype, nodes))
    }

    /// The decode step graph for `sampler` at the current cache capacity, built but not
    /// loaded (what a decode step would run).
    pub fn decode_graph(&self, sampler: &SamplerSettings) -> Result<Graph> {
        let capacity = if self.capacity > 0 {
            self.capacity
        } else {
            CACHE_CHUNK.min(self.max_context)
        };
        decode_graph(&self.model, self.dtype, sampler, capacity)
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
        self.stats_of.clear();
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
        let graph = step_graph(&self.model, self.dtype, head, t, self.capacity)?;
        let kind = match head {
            Head::None => "prefill",
            Head::Sample(_) if t == 1 => "decode",
            Head::Sample(_) => "prefill+sample",
            Head::Nll => "nll",
        };
        if kind == "decode" {
            if let Some(path) = &self.export_dot {
                std::fs::write(path, stats::to_dot(&graph))
                    .with_context(|| format!("writing the decode graph to {}", path.display()))?;
            }
        }
        let id = self.session.load(&graph, CompileOptions::default())?;
        self.stats_of.insert(id, self.built.len());
        self.built.push(StepGraphStats {
            kind,
            tokens: t,
            capacity: self.capacity,
            stats: stats::stats(&graph),
            runs: 0,
        });
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
        if self.trace {
            if let Some(&i) = self.stats_of.get(&id) {
                self.built[i].runs += 1;
            }
        }
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
        let out = self.step(&head, chunks[chunks.len() - 1], extra)?;
        if let Some(lse) = out.get(1).map(|l| l.to_f64_vec()[0]).filter(|v| !v.is_finite()) {
            bail!(
                "the model's logits after the prompt are not finite (log-sum-exp {lse}): corrupt \
                 weights, or activations overflowing {}; try --dtype f32",
                self.dtype.activations
            );
        }
        let mut next = out[0].to_vec::<u32>()?[0];
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
        // A log-softmax of finite logits is finite: anything else is a broken model or dtype.
        if let Some((i, v)) = nll.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            bail!(
                "the negative log-likelihood of token {} is {v}: the model's logits are not finite \
                 (corrupt weights, or activations overflowing their dtype: try --dtype f32)",
                i + 1
            );
        }
        Ok(nll)
    }
}

/// The decode step graph (one token, sampler head) of `model` typed by `dtype` over a cache
/// of `capacity` positions, after the default passes: what a decode step runs, on any
/// backend, built without one.
pub fn decode_graph(
    model: &Transformer,
    dtype: GraphDType,
    sampler: &SamplerSettings,
    capacity: usize,
) -> Result<Graph> {
    step_graph(model, dtype, &Head::Sample(sampler.clone()), 1, capacity)
}

fn step_graph(model: &Transformer, dtype: GraphDType, head: &Head, t: usize, capacity: usize) -> Result<Graph> {
    let mut b = GraphBuilder::new(dtype.options);
    let inputs = StepInputs {
        tokens: b.input("tokens", DType::I32, &[1, t]),
        positions: b.input("positions", DType::I32, &[t]),
        offset: b.input("offset", DType::I32, &[]),
        kv_len: mlxcel_core::NodeId(0), // set below
        tokens_len: t,
        capacity,
        dtype: dtype.activations,
        last_only: !matches!(head, Head::Nll),
    };
    let kv_len = b.add_scalar(inputs.offset, t as f32)?;
    let inputs = StepInputs { kv_len, ..inputs };
    let logits = model.forward(&mut b, &inputs)?;
    let vocab = model.spec.vocab;
    let outputs = match head {
        Head::None => vec![],
        Head::Sample(s) => {
            let logits = b.reshape(logits, &[1, vocab])?;
            let token = sampler::build(&mut b, logits, s)?.0;
            if t == 1 {
                vec![token]
            } else {
                // After a prompt (not in the replayed decode step): the logits' log-sum-exp,
                // which NaN or +inf anywhere makes non-finite, for `generate` to check.
                let lse = b.reduce(mlxcel_core::ReduceOp::LogSumExp, logits, -1, false)?;
                vec![token, lse]
            }
        }
        Head::Nll => {
            // A measurement, not a decode step: one widening of the logits so the
            // log-sum-exp and the difference are exact to f32 whatever the graph dtype.
            let logits = b.reshape(logits, &[t, vocab])?;
            let logits = b.astype(logits, DType::F32);
            let targets = b.input("targets", DType::I32, &[t, 1]);
            let lse = b.reduce(mlxcel_core::ReduceOp::LogSumExp, logits, -1, false)?;
            let picked = b.take_along_axis(logits, targets, -1)?;
            let picked = b.reshape(picked, &[t])?;
            vec![b.sub(lse, picked)?]
        }
    };
    Ok(run_passes(&b.finish(&outputs), &default_passes())?)
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
