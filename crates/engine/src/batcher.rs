//! Continuous batching: the scheduler's plans run on the paged engine, one step at a time.

use std::collections::HashMap;

use anyhow::Result;

use crate::blocks::SeqId;
use crate::paged::{PagedEngine, Row};
use crate::sampler::{self, SamplerSettings, TokenLogprobs};
use crate::scheduler::Scheduler;
use crate::FinishReason;

/// How one sequence samples and ends.
#[derive(Clone, Debug)]
pub struct SeqParams {
    pub max_tokens: usize,
    /// Temperature, top-k/top-p/min-p, repetition penalty and seed, applied on the host to
    /// this sequence's row of logits (rows of one batch sample differently).
    pub sampler: SamplerSettings,
    pub eos: Vec<u32>,
    /// Report each token's log-probability and this many alternatives (None: none).
    pub logprobs: Option<usize>,
}

impl SeqParams {
    /// Whether the argmax the step graph returns is this sequence's token: the masks keep the
    /// most likely token, so only temperature and the penalty change the choice.
    fn greedy(&self) -> bool {
        self.sampler.is_greedy() && !self.sampler.uses_penalty()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A token, with its log-probabilities when the sequence asked for them.
    Token(u32, Option<TokenLogprobs>),
    /// The sequence is done and its blocks are back in the pool.
    Finished(FinishReason),
    /// The step failed; the sequence is dropped.
    Failed(String),
}

pub struct Batcher {
    pub sched: Scheduler,
    engine: PagedEngine,
    params: HashMap<SeqId, SeqParams>,
    /// Steps run so far.
    pub steps: u64,
    /// Sequences preempted so far.
    pub preemptions: u64,
}

impl Batcher {
    pub fn new(sched: Scheduler, engine: PagedEngine) -> Batcher {
        Batcher {
            sched,
            engine,
            params: HashMap::new(),
            steps: 0,
            preemptions: 0,
        }
    }

    pub fn engine(&self) -> &PagedEngine {
        &self.engine
    }

    pub fn add(&mut self, id: SeqId, prompt: Vec<u32>, params: SeqParams) {
        self.params.insert(id, params);
        self.sched.add(id, prompt);
    }

    /// Drops `id` (disconnect, stop string); its blocks return at once.
    pub fn cancel(&mut self, id: SeqId) {
        self.params.remove(&id);
        self.sched.remove(id);
    }

    pub fn is_idle(&self) -> bool {
        self.sched.is_idle()
    }

    /// Whether `id`'s next token needs the step's logits on the host.
    fn wants_logits(&self, id: SeqId) -> bool {
        let p = &self.params[&id];
        !p.greedy() || p.logprobs.is_some()
    }

    fn sample(&self, id: SeqId, argmax: u32, logits: Option<&[f32]>) -> (u32, Option<TokenLogprobs>) {
        let p = &self.params[&id];
        let token = match logits {
            Some(l) if !p.greedy() => {
                let seq = self.sched.seq(id);
                let counter = seq.map_or(0, |s| s.generated().len() as u32);
                let history = seq.map_or(&[][..], |s| &s.tokens[..]);
                sampler::sample_host(l, &p.sampler, counter, history)
            }
            _ => argmax,
        };
        let lp = p.logprobs.zip(logits).map(|(top, l)| sampler::logprobs(l, token, top));
        (token, lp)
    }

    /// Records `token` for `id` and reports it; ends the sequence on EOS or length.
    fn accept(
        &mut self,
        id: SeqId,
        (token, lp): (u32, Option<TokenLogprobs>),
        decoded: bool,
        emit: &mut dyn FnMut(SeqId, Event),
    ) {
        let p = &self.params[&id];
        if p.eos.contains(&token) {
            emit(id, Event::Finished(FinishReason::Stop));
            self.cancel(id);
            return;
        }
        self.sched.push_token(id, token, decoded);
        emit(id, Event::Token(token, lp));
        let seq = self.sched.seq(id).expect("running");
        if seq.generated().len() >= self.params[&id].max_tokens {
            emit(id, Event::Finished(FinishReason::Length));
            self.cancel(id);
        }
    }

    fn fail(&mut self, ids: &[SeqId], e: &anyhow::Error, emit: &mut dyn FnMut(SeqId, Event)) {
        for &id in ids {
            emit(id, Event::Failed(format!("{e:#}")));
            self.cancel(id);
        }
    }

    /// One step: a batched decode of every prefilled sequence, then the planned prefill chunks
    /// as one batched launch.
    pub fn step(&mut self, emit: &mut dyn FnMut(SeqId, Event)) -> Result<()> {
        let plan = self.sched.plan();
        self.preemptions += plan.preempted.len() as u64;
        if plan.is_empty() {
            return Ok(());
        }
        self.steps += 1;
        let started = std::time::Instant::now();
        let mut decoded = std::time::Duration::ZERO;
        if !plan.decode.is_empty() {
            let want_logits = plan.decode.iter().any(|&id| self.wants_logits(id));
            let rows: Vec<Row> = plan
                .decode
                .iter()
                .map(|&id| {
                    let at = self.sched.seq(id).expect("planned").computed;
                    row(&self.sched, id, at, 1)
                })
                .collect();
            match self.engine.step(&rows, want_logits) {
                Ok(out) => {
                    for (r, &id) in plan.decode.iter().enumerate() {
                        let logits = out.logits.as_ref().map(|l| l[r].as_slice());
                        let sampled = self.sample(id, out.argmax[r], logits);
                        self.accept(id, sampled, true, emit);
                    }
                }
                Err(e) => self.fail(&plan.decode, &e, emit),
            }
            decoded = started.elapsed();
        }
        if !plan.prefill.is_empty() {
            let ids: Vec<SeqId> = plan.prefill.iter().map(|p| p.0).collect();
            let want_logits = ids.iter().any(|&id| self.wants_logits(id));
            let rows: Vec<Row> = plan
                .prefill
                .iter()
                .map(|&(id, start, len)| row(&self.sched, id, start, len))
                .collect();
            match self.engine.step(&rows, want_logits) {
                Ok(out) => {
                    for (r, &(id, _, len)) in plan.prefill.iter().enumerate() {
                        if self.sched.prefilled(id, len) {
                            let logits = out.logits.as_ref().map(|l| l[r].as_slice());
                            let sampled = self.sample(id, out.argmax[r], logits);
                            self.accept(id, sampled, false, emit);
                        }
                    }
                }
                Err(e) => self.fail(&ids, &e, emit),
            }
        }
        if step_log() {
            let tokens: usize = plan.prefill.iter().map(|p| p.2).sum();
            eprintln!(
                "step {}: decode {} rows {:.2} ms, prefill {} rows {tokens} tokens {:.2} ms",
                self.steps,
                plan.decode.len(),
                decoded.as_secs_f64() * 1e3,
                plan.prefill.len(),
                (started.elapsed() - decoded).as_secs_f64() * 1e3
            );
        }
        Ok(())
    }
}

/// `MLXCEL_STEP_LOG=1`: each step's decode rows, prefill rows and tokens, and the wall time of
/// each part, on stderr (where a server's time goes between requests; `mlxcel serve` adds when
/// each request came and when the engine took it).
pub fn step_log() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLXCEL_STEP_LOG").is_ok_and(|v| v == "1"))
}

/// The step row of planned sequence `id`: its `len` tokens from position `start`, over its
/// block table.
fn row(sched: &Scheduler, id: SeqId, start: usize, len: usize) -> Row<'_> {
    let s = sched.seq(id).expect("planned");
    Row {
        tokens: &s.tokens[start..start + len],
        start,
        table: sched.pool.table(id),
    }
}
