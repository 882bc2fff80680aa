//! Continuous batching as plain data: which sequences run, which wait, what each step does.
//!
//! Every step decodes one token for each running sequence that has finished its prefill and
//! runs a prefill chunk of the oldest sequence still prefilling, with the next chunks of as many
//! other prefilling sequences as have the same length and fit the step's prefill budget (one
//! batched launch), so new requests join without stalling running streams. A sequence joins
//! when the pool can hold its whole prompt; when a decode step finds the pool full, the
//! youngest running sequence is preempted: its blocks go back and it waits at the head of the
//! queue, to be recomputed from its tokens so far.

use std::collections::VecDeque;

use crate::blocks::{BlockPool, SeqId};

#[derive(Clone, Debug)]
pub struct Seq {
    pub id: SeqId,
    /// Prompt, then generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Positions whose keys and values are in the pool.
    pub computed: usize,
    /// Whether the prefill of `tokens` finished (the last token then awaits decode).
    pub prefilled: bool,
    /// Times this sequence was preempted.
    pub preemptions: usize,
}

impl Seq {
    pub fn generated(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }
}

/// One step's work.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Sequences that decode their last token (position `computed`).
    pub decode: Vec<SeqId>,
    /// Prefill chunks, all of one length, the oldest prefilling sequence's first:
    /// `(sequence, first position, tokens)`; a power of two of them (one step graph each).
    pub prefill: Vec<(SeqId, usize, usize)>,
    /// Sequences preempted while planning (their blocks are back in the pool).
    pub preempted: Vec<SeqId>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.decode.is_empty() && self.prefill.is_empty()
    }
}

pub struct Scheduler {
    pub pool: BlockPool,
    max_batch: usize,
    prefill_chunk: usize,
    /// Most prefill tokens a step (at least one chunk).
    prefill_tokens: usize,
    waiting: VecDeque<Seq>,
    /// In admission order: the last is the youngest.
    running: Vec<Seq>,
}

impl Scheduler {
    /// `prefill_chunk` is rounded down to whole blocks (at least one), so every chunk starts
    /// on a block boundary.
    pub fn new(pool: BlockPool, max_batch: usize, prefill_chunk: usize) -> Scheduler {
        let bs = pool.block_size();
        let prefill_chunk = (prefill_chunk / bs).max(1) * bs;
        Scheduler {
            pool,
            max_batch: max_batch.max(1),
            prefill_chunk,
            prefill_tokens: prefill_chunk,
            waiting: VecDeque::new(),
            running: Vec::new(),
        }
    }

    /// Lets a step prefill up to `tokens` positions (at least one chunk), in chunks of several
    /// sequences; by default a step prefills one chunk.
    pub fn with_prefill_tokens(mut self, tokens: usize) -> Scheduler {
        self.prefill_tokens = tokens.max(self.prefill_chunk);
        self
    }

    /// Queues a new sequence. The caller checks that `prompt` fits the pool on its own.
    pub fn add(&mut self, id: SeqId, prompt: Vec<u32>) {
        self.waiting.push_back(Seq {
            id,
            prompt_len: prompt.len(),
            tokens: prompt,
            computed: 0,
            prefilled: false,
            preemptions: 0,
        });
    }

    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    pub fn seq(&self, id: SeqId) -> Option<&Seq> {
        self.running.iter().chain(self.waiting.iter()).find(|s| s.id == id)
    }

    pub fn ids(&self) -> Vec<SeqId> {
        self.running.iter().chain(self.waiting.iter()).map(|s| s.id).collect()
    }

    /// Drops `id` wherever it is and returns its blocks (finish, error, disconnect).
    pub fn remove(&mut self, id: SeqId) -> Option<Seq> {
        self.pool.release(id);
        if let Some(i) = self.running.iter().position(|s| s.id == id) {
            return Some(self.running.remove(i));
        }
        let i = self.waiting.iter().position(|s| s.id == id)?;
        self.waiting.remove(i)
    }

    fn preempt_youngest(&mut self) -> SeqId {
        let mut seq = self.running.pop().expect("preempting needs a running sequence");
        self.pool.release(seq.id);
        seq.computed = 0;
        seq.prefilled = false;
        seq.preemptions += 1;
        let id = seq.id;
        self.waiting.push_front(seq);
        id
    }

    /// Decides the next step, reserving the blocks it writes.
    pub fn plan(&mut self) -> Plan {
        let mut plan = Plan::default();
        // Decodes first: running streams keep flowing.
        let mut i = 0;
        while i < self.running.len() {
            let seq = &self.running[i];
            if !seq.prefilled {
                i += 1;
                continue;
            }
            let (id, need) = (seq.id, seq.computed + 1);
            if self.pool.reserve(id, need) {
                i += 1;
                continue;
            }
            let victim = self.preempt_youngest();
            plan.preempted.push(victim);
            // The victim was at the end; if it was this one, the loop ends by itself.
        }
        plan.decode = self.running.iter().filter(|s| s.prefilled).map(|s| s.id).collect();
        // Admit while there is room in the batch and blocks for the whole prompt.
        while self.running.len() < self.max_batch {
            let Some(next) = self.waiting.front() else { break };
            if !self.pool.reserve(next.id, next.tokens.len()) {
                break;
            }
            let seq = self.waiting.pop_front().expect("front exists");
            self.running.push(seq);
        }
        let chunk = |s: &Seq| (s.tokens.len() - s.computed).min(self.prefill_chunk);
        if let Some(oldest) = self.running.iter().find(|s| !s.prefilled) {
            let len = chunk(oldest);
            let most = (self.prefill_tokens / len).clamp(1, self.max_batch);
            let mut same: Vec<_> = self
                .running
                .iter()
                .filter(|s| !s.prefilled && chunk(s) == len)
                .take(most)
                .map(|s| (s.id, s.computed, len))
                .collect();
            // A power of two of rows: the step graphs stay few and none computes padding.
            same.truncate(1 << same.len().ilog2());
            plan.prefill = same;
        }
        plan
    }

    fn running_mut(&mut self, id: SeqId) -> &mut Seq {
        self.running
            .iter_mut()
            .find(|s| s.id == id)
            .expect("the sequence is running")
    }

    /// After a prefill chunk of `len` positions: true when the prefill is complete (its last
    /// logits then give the next token).
    pub fn prefilled(&mut self, id: SeqId, len: usize) -> bool {
        let seq = self.running_mut(id);
        seq.computed += len;
        seq.prefilled = seq.computed == seq.tokens.len();
        seq.prefilled
    }

    /// Records a new token of `id`; after a decode step the decoded position is computed.
    pub fn push_token(&mut self, id: SeqId, token: u32, decoded: bool) {
        let seq = self.running_mut(id);
        if decoded {
            seq.computed += 1;
        }
        seq.tokens.push(token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs plans as a model would (token = position), `budget` steps; returns finished ids.
    fn drive(s: &mut Scheduler, max_new: usize, budget: usize) -> Vec<SeqId> {
        let mut done = Vec::new();
        for _ in 0..budget {
            let plan = s.plan();
            if plan.is_empty() {
                break;
            }
            let mut finished = Vec::new();
            for &id in &plan.decode {
                let seq = s.seq(id).unwrap();
                assert_eq!(seq.computed + 1, seq.tokens.len(), "decode input is the last token");
                assert!(s.pool.held(id) * s.pool.block_size() > seq.computed);
                let t = seq.tokens.len() as u32;
                s.push_token(id, t, true);
                if s.seq(id).unwrap().generated().len() == max_new {
                    finished.push(id);
                }
            }
            for &(id, start, len) in &plan.prefill {
                let seq = s.seq(id).unwrap();
                assert_eq!(start % s.pool.block_size(), 0, "chunks start on block boundaries");
                assert!(s.pool.held(id) * s.pool.block_size() >= start + len);
                let t = seq.tokens.len() as u32;
                if s.prefilled(id, len) {
                    s.push_token(id, t, false);
                    if s.seq(id).unwrap().generated().len() == max_new {
                        finished.push(id);
                    }
                }
            }
            for id in finished {
                let seq = s.remove(id).unwrap();
                // Tokens are their own positions: recompute after preemption changes nothing.
                let want: Vec<u32> = (seq.prompt_len as u32..seq.tokens.len() as u32).collect();
                assert_eq!(seq.generated(), want.as_slice());
                done.push(id);
            }
        }
        done
    }

    fn prompt(len: usize) -> Vec<u32> {
        (0..len as u32).collect()
    }

    #[test]
    fn all_sequences_finish_and_the_pool_is_full_again() {
        let mut s = Scheduler::new(BlockPool::new(64, 4), 8, 8);
        for id in 0..20 {
            s.add(id, prompt(3 + id as usize % 11));
        }
        let mut done = drive(&mut s, 9, 10_000);
        done.sort();
        assert_eq!(done, (0..20).collect::<Vec<_>>());
        assert!(s.is_idle());
        assert_eq!(s.pool.free_blocks(), 64);
        assert_eq!(s.pool.holders(), 0);
    }

    #[test]
    fn batch_never_exceeds_the_limit_and_prefill_is_one_chunk_per_step() {
        let mut s = Scheduler::new(BlockPool::new(1000, 4), 3, 8);
        for id in 0..10 {
            s.add(id, prompt(20));
        }
        for _ in 0..50 {
            let plan = s.plan();
            assert!(s.running() <= 3);
            assert!(plan.decode.len() <= 3);
            assert!(plan.prefill.len() <= 1, "one chunk a step by default");
            for &(id, _, len) in &plan.prefill {
                assert!(len <= 8);
                assert!(!plan.decode.contains(&id));
                if s.prefilled(id, len) {
                    s.push_token(id, 0, false);
                }
            }
            for &id in &plan.decode {
                s.push_token(id, 0, true);
            }
        }
    }

    #[test]
    fn a_step_prefills_chunks_of_one_length_from_several_sequences() {
        // Chunks of 8, 24 prefill tokens a step: at most three rows, so two (a power of two).
        let mut s = Scheduler::new(BlockPool::new(1000, 4), 8, 8).with_prefill_tokens(24);
        for id in 0..5 {
            s.add(id, prompt(if id == 1 { 4 } else { 20 }));
        }
        let plan = s.plan();
        assert_eq!(
            plan.prefill,
            vec![(0, 0, 8), (2, 0, 8)],
            "the oldest first, same length only"
        );
        for &(id, _, len) in &plan.prefill {
            assert!(!s.prefilled(id, len));
        }
        // Sequence 1's one chunk (4 positions) waits: the oldest's length (8) leads the step.
        let plan = s.plan();
        assert_eq!(plan.prefill, vec![(0, 8, 8), (2, 8, 8)]);
        for &(id, _, len) in &plan.prefill {
            s.prefilled(id, len);
        }
        let plan = s.plan();
        // Three sequences have 4 left (0, 1, 2): two of them, the oldest first.
        assert_eq!(
            plan.prefill,
            vec![(0, 16, 4), (1, 0, 4)],
            "remainders of one length join"
        );
        // Everything still finishes, with the pool whole again.
        let mut done = drive(&mut s, 5, 10_000);
        done.sort();
        assert_eq!(done, (0..5).collect::<Vec<_>>());
        assert_eq!(s.pool.free_blocks(), 1000);
    }

    #[test]
    fn a_full_pool_preempts_the_youngest_and_it_recomputes() {
        // 6 blocks of 2: two sequences of prompt 4 (2 blocks each) then growth collides.
        let mut s = Scheduler::new(BlockPool::new(6, 2), 4, 4);
        s.add(1, prompt(4));
        s.add(2, prompt(4));
        let mut preempted = Vec::new();
        let mut done = Vec::new();
        for _ in 0..200 {
            let plan = s.plan();
            preempted.extend(plan.preempted.iter().copied());
            if plan.is_empty() {
                break;
            }
            for &id in &plan.decode {
                let t = s.seq(id).unwrap().tokens.len() as u32;
                s.push_token(id, t, true);
            }
            for &(id, _, len) in &plan.prefill {
                let t = s.seq(id).unwrap().tokens.len() as u32;
                if s.prefilled(id, len) {
                    s.push_token(id, t, false);
                }
            }
            for id in s.ids() {
                let seq = s.seq(id).unwrap();
                if seq.generated().len() >= 6 {
                    let seq = s.remove(id).unwrap();
                    let want: Vec<u32> = (4..seq.tokens.len() as u32).collect();
                    assert_eq!(seq.generated(), want.as_slice());
                    done.push(id);
                }
            }
            let held: usize = [1, 2].iter().map(|&id| s.pool.held(id)).sum();
            assert_eq!(held + s.pool.free_blocks(), 6, "no block leaks");
        }
        assert!(
            preempted.contains(&2),
            "the younger sequence was preempted: {preempted:?}"
        );
        done.sort();
        assert_eq!(done, vec![1, 2]);
        assert_eq!(s.pool.free_blocks(), 6);
    }

    #[test]
    fn removing_a_sequence_anywhere_returns_its_blocks() {
        let mut s = Scheduler::new(BlockPool::new(10, 4), 1, 16);
        s.add(1, prompt(8));
        s.add(2, prompt(8));
        let plan = s.plan();
        assert_eq!(plan.prefill, vec![(1, 0, 8)]);
        assert_eq!(s.pool.held(1), 2);
        assert_eq!(s.waiting(), 1);
        assert!(s.remove(2).is_some(), "a waiting sequence");
        assert!(s.remove(1).is_some(), "a running sequence");
        assert!(s.remove(1).is_none());
        assert_eq!(s.pool.free_blocks(), 10);
        assert!(s.is_idle());
    }

    #[test]
    fn a_prompt_waits_until_the_pool_can_hold_it() {
        let mut s = Scheduler::new(BlockPool::new(4, 4), 8, 16);
        s.add(1, prompt(12)); // 3 blocks
        s.add(2, prompt(8)); // 2 blocks: waits
        s.plan();
        assert_eq!((s.running(), s.waiting()), (1, 1));
        s.remove(1);
        s.plan();
        assert_eq!((s.running(), s.waiting()), (1, 0));
    }
}
