//! The engine thread: takes requests from the HTTP side, runs batched steps, and sends each
//! request its tokens. A request whose receiver is gone (client closed, stop string) is dropped
//! before the next step, and its blocks go back to the pool.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use mlxcel_engine::batcher::{Batcher, Event, SeqParams};
use mlxcel_engine::blocks::SeqId;
use tokio::sync::mpsc::UnboundedSender;

pub struct Submit {
    pub id: SeqId,
    /// When the HTTP side began reading the request (for the step log).
    pub received: Instant,
    pub prompt: Vec<u32>,
    pub params: SeqParams,
    pub events: UnboundedSender<Event>,
}

/// Counters the HTTP side reads for `/health`.
#[derive(Default)]
pub struct Stats {
    pub steps: AtomicU64,
    pub free_blocks: AtomicU64,
    pub total_blocks: AtomicU64,
    pub running: AtomicU64,
    pub waiting: AtomicU64,
    pub preemptions: AtomicU64,
    /// Requests ended early because their receiver went away (the client closed, or a stop
    /// string ended the text on the HTTP side).
    pub dropped: AtomicU64,
}

fn publish(stats: &Stats, b: &Batcher) {
    stats.steps.store(b.steps, Ordering::Relaxed);
    stats
        .free_blocks
        .store(b.sched.pool.free_blocks() as u64, Ordering::Relaxed);
    stats.running.store(b.sched.running() as u64, Ordering::Relaxed);
    stats.waiting.store(b.sched.waiting() as u64, Ordering::Relaxed);
    stats.preemptions.store(b.preemptions, Ordering::Relaxed);
}

/// After an idle engine's first request, how long a gap between the next ones ends the wait,
/// and the longest the first step waits for them.
const IDLE_GATHER_GAP: Duration = Duration::from_millis(3);
const IDLE_GATHER_MAX: Duration = Duration::from_millis(20);

/// Takes from `rx` what arrives with gaps shorter than `gap`, for at most `most` in all, into
/// `take` (a burst of requests after an idle engine's first).
fn gather<T>(rx: &mpsc::Receiver<T>, gap: Duration, most: Duration, mut take: impl FnMut(T)) {
    let until = Instant::now() + most;
    while let Ok(item) = rx.recv_timeout(gap.min(until.saturating_duration_since(Instant::now()))) {
        take(item);
    }
}

/// Runs until every sender of `rx` is gone.
pub fn run(mut batcher: Batcher, rx: mpsc::Receiver<Submit>, stats: Arc<Stats>) {
    stats
        .total_blocks
        .store(batcher.sched.pool.total_blocks() as u64, Ordering::Relaxed);
    publish(&stats, &batcher);
    let mut senders: HashMap<SeqId, UnboundedSender<Event>> = HashMap::new();
    let epoch = Instant::now();
    let admit = |s: Submit, batcher: &mut Batcher, senders: &mut HashMap<SeqId, UnboundedSender<Event>>| {
        if mlxcel_engine::batcher::step_log() {
            // Whether a burst reaches the engine spread out (client or HTTP side) or waits in
            // the queue (the engine busy with a step).
            eprintln!(
                "admit {} at step {}: received at {:.2} ms, taken {:.2} ms later",
                s.id,
                batcher.steps,
                s.received.saturating_duration_since(epoch).as_secs_f64() * 1e3,
                s.received.elapsed().as_secs_f64() * 1e3
            );
        }
        batcher.add(s.id, s.prompt, s.params);
        senders.insert(s.id, s.events);
    };
    loop {
        if batcher.is_idle() {
            match rx.recv() {
                Ok(s) => admit(s, &mut batcher, &mut senders),
                Err(_) => return,
            }
            // A burst of requests (clients starting together) wakes an idle engine with its
            // first: the others, arriving within a few milliseconds, join that first step's
            // prefill rather than each costing a step of its own.
            gather(&rx, IDLE_GATHER_GAP, IDLE_GATHER_MAX, |s| {
                admit(s, &mut batcher, &mut senders)
            });
        }
        while let Ok(s) = rx.try_recv() {
            admit(s, &mut batcher, &mut senders);
        }
        senders.retain(|&id, tx| {
            let open = !tx.is_closed();
            if !open {
                batcher.cancel(id);
                stats.dropped.fetch_add(1, Ordering::Relaxed);
            }
            open
        });
        let result = batcher.step(&mut |id, ev| {
            let last = !matches!(ev, Event::Token(..));
            if let Some(tx) = senders.get(&id) {
                let _ = tx.send(ev);
            }
            if last {
                senders.remove(&id);
            }
        });
        if let Err(e) = result {
            // Not expected (step errors are per sequence); fail everyone rather than spin.
            for (id, tx) in senders.drain() {
                let _ = tx.send(Event::Failed(format!("{e:#}")));
                batcher.cancel(id);
            }
        }
        publish(&stats, &batcher);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlxcel_core::DType;
    use mlxcel_engine::blocks::BlockPool;
    use mlxcel_engine::paged::PagedEngine;
    use mlxcel_engine::scheduler::Scheduler;
    use mlxcel_engine::SamplerSettings;

    /// Spaced `gap` apart on another thread, `count` items after a first one already queued.
    fn spaced(count: u32, gap: Duration) -> mpsc::Receiver<u32> {
        let (tx, rx) = mpsc::channel();
        tx.send(0).unwrap();
        std::thread::spawn(move || {
            for i in 1..=count {
                std::thread::sleep(gap);
                if tx.send(i).is_err() {
                    return;
                }
            }
        });
        rx
    }

    #[test]
    fn a_burst_is_gathered_until_a_gap_or_the_limit() {
        // Items 20 ms apart, a gap of a second: all of them (the limit far off).
        let rx = spaced(4, Duration::from_millis(20));
        let mut got = Vec::new();
        gather(&rx, Duration::from_secs(1), Duration::from_secs(30), |i| got.push(i));
        assert_eq!(got, [0, 1, 2, 3, 4]);
        // Items a second apart, a gap of 100 ms: only the one already there.
        let rx = spaced(2, Duration::from_secs(1));
        let mut got = Vec::new();
        gather(&rx, Duration::from_millis(100), Duration::from_secs(30), |i| {
            got.push(i)
        });
        assert_eq!(got, [0]);
        // Items 20 ms apart without end, a gap of a second: the limit (300 ms) ends the wait.
        let rx = spaced(u32::MAX, Duration::from_millis(20));
        let start = Instant::now();
        let mut got = 0;
        gather(&rx, Duration::from_secs(1), Duration::from_millis(300), |_| got += 1);
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(5),
            "{took:?}"
        );
        assert!(got >= 2, "{got} items in 300 ms");
    }

    /// The engine side of a disconnect, without a socket in between: once a request's receiver
    /// is gone, its blocks are back in the pool after at most the one step that was already
    /// under way (the HTTP test in tests/serve.rs allows for the socket's delay on top).
    #[test]
    fn a_dropped_receiver_frees_its_blocks_within_one_step() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/parity/llama-bf16");
        let model = mlxcel_models::load(&dir).unwrap();
        let (blocks, block_size) = (64, 16);
        let engine = PagedEngine::new(model, &mlxcel_cpu::CpuBackend, DType::F32, blocks, block_size, 256).unwrap();
        let sched = Scheduler::new(BlockPool::new(blocks, block_size), 8, 64);
        let stats = Arc::new(Stats::default());
        let (tx, rx) = mpsc::channel();
        let worker = {
            let stats = stats.clone();
            std::thread::spawn(move || run(Batcher::new(sched, engine), rx, stats))
        };
        // A drop that comes after the request would have ended anyway (a stalled test thread
        // on a busy machine) shows nothing: such a try is run again.
        let max_tokens = 200;
        let conclusive = (1..=5).any(|id| {
            let (events, mut tokens) = tokio::sync::mpsc::unbounded_channel();
            let params = SeqParams {
                max_tokens,
                sampler: SamplerSettings::default(),
                eos: vec![],
                logprobs: None,
            };
            let started = stats.steps.load(Ordering::Relaxed);
            tx.send(Submit {
                id,
                received: Instant::now(),
                prompt: vec![1, 2, 3, 4, 5],
                params,
                events,
            })
            .unwrap();
            for _ in 0..3 {
                assert!(matches!(tokens.blocking_recv(), Some(Event::Token(..))));
            }
            drop(tokens);
            // Read after the drop: a step under way then is at most one more.
            let at_drop = stats.steps.load(Ordering::Relaxed);
            let start = Instant::now();
            while stats.free_blocks.load(Ordering::Relaxed) != blocks as u64 {
                assert!(start.elapsed() < Duration::from_secs(20), "the blocks never came back");
                std::thread::sleep(Duration::from_millis(1));
            }
            let steps = stats.steps.load(Ordering::Relaxed) - at_drop;
            if at_drop - started + 2 >= max_tokens as u64 {
                return false;
            }
            assert!(steps <= 1, "blocks back {steps} steps after the drop");
            true
        });
        assert!(conclusive, "every try's request ran to its end before the drop");
        drop(tx);
        worker.join().unwrap();
    }
}
