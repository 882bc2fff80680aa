//! Continuous batching: the scheduler's plans run on the paged engine, one step at a time.

use std::collections::HashMap;

use anyhow::Result;

use crate::blocks::SeqId;
use crate::paged::{PagedEngine, Row};
use crate::sampler;
use crate::scheduler::Scheduler;
use crate::FinishReason;

/// How one sequence samples and ends.
#[derive(Clone, Debug)]
pub struct SeqParams {
    pub max_tokens: usize,
    /// 0 is greedy.
    pub temperature: f32,
    pub top_p: f32,
    pub seed: u64,
    pub eos: Vec<u32>,
}

impl SeqParams {
    fn greedy(&self) -> bool {
        self.temperature == 0.0 && self.top_p >= 1.0
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Token(u32),
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

    fn sample(&self, id: SeqId, argmax: u32, logits: Option<&[f32]>) -> u32 {
        let p = &self.params[&id];
        match logits {
            Some(l) if !p.greedy() => {
                let counter = self.sched.seq(id).map_or(0, |s| s.generated().len() as u32);
                sampler::sample_host(l, p.temperature, p.top_p, p.seed, counter)
            }
            _ => argmax,
        }
    }

    /// Records `token` for `id` and reports it; ends the sequence on EOS or length.
    fn accept(&mut self, id: SeqId, token: u32, decoded: bool, emit: &mut dyn FnMut(SeqId, Event)) {
        let p = &self.params[&id];
        if p.eos.contains(&token) {
            emit(id, Event::Finished(FinishReason::Stop));
            self.cancel(id);
            return;
        }
        self.sched.push_token(id, token, decoded);
        emit(id, Event::Token(token));
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

    /// One step: a batched decode of every prefilled sequence and one prefill chunk.
    pub fn step(&mut self, emit: &mut dyn FnMut(SeqId, Event)) -> Result<()> {
        let plan = self.sched.plan();
        self.preemptions += plan.preempted.len() as u64;
        if plan.is_empty() {
            return Ok(());
        }
        self.steps += 1;
        if !plan.decode.is_empty() {
            let want_logits = plan.decode.iter().any(|id| !self.params[id].greedy());
            let rows: Vec<Row> = plan
                .decode
                .iter()
                .map(|&id| {
                    let s = self.sched.seq(id).expect("planned");
                    Row {
                        tokens: &s.tokens[s.computed..s.computed + 1],
                        start: s.computed,
                        table: self.sched.pool.table(id),
                    }
                })
                .collect();
            match self.engine.step(&rows, want_logits) {
                Ok(out) => {
                    for (r, &id) in plan.decode.iter().enumerate() {
                        let logits = out.logits.as_ref().map(|l| l[r].as_slice());
                        let token = self.sample(id, out.argmax[r], logits);
                        self.accept(id, token, true, emit);
                    }
                }
                Err(e) => self.fail(&plan.decode, &e, emit),
            }
        }
        if let Some((id, start, len)) = plan.prefill {
            let greedy = self.params[&id].greedy();
            let s = self.sched.seq(id).expect("planned");
            let row = Row {
                tokens: &s.tokens[start..start + len],
                start,
                table: self.sched.pool.table(id),
            };
            match self.engine.step(&[row], !greedy) {
                Ok(out) => {
                    if self.sched.prefilled(id, len) {
                        let logits = out.logits.as_ref().map(|l| l[0].as_slice());
                        let token = self.sample(id, out.argmax[0], logits);
                        self.accept(id, token, false, emit);
                    }
                }
                Err(e) => self.fail(&[id], &e, emit),
            }
        }
        Ok(())
    }
}
