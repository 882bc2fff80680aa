//! The engine thread: takes requests from the HTTP side, runs batched steps, and sends each
//! request its tokens. A request whose receiver is gone (client closed, stop string) is dropped
//! before the next step, and its blocks go back to the pool.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};

use mlxcel_engine::batcher::{Batcher, Event, SeqParams};
use mlxcel_engine::blocks::SeqId;
use tokio::sync::mpsc::UnboundedSender;

pub struct Submit {
    pub id: SeqId,
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

/// Runs until every sender of `rx` is gone.
pub fn run(mut batcher: Batcher, rx: mpsc::Receiver<Submit>, stats: Arc<Stats>) {
    stats
        .total_blocks
        .store(batcher.sched.pool.total_blocks() as u64, Ordering::Relaxed);
    publish(&stats, &batcher);
    let mut senders: HashMap<SeqId, UnboundedSender<Event>> = HashMap::new();
    let admit = |s: Submit, batcher: &mut Batcher, senders: &mut HashMap<SeqId, UnboundedSender<Event>>| {
        batcher.add(s.id, s.prompt, s.params);
        senders.insert(s.id, s.events);
    };
    loop {
        if batcher.is_idle() {
            match rx.recv() {
                Ok(s) => admit(s, &mut batcher, &mut senders),
                Err(_) => return,
            }
        }
        while let Ok(s) = rx.try_recv() {
            admit(s, &mut batcher, &mut senders);
        }
        senders.retain(|&id, tx| {
            let open = !tx.is_closed();
            if !open {
                batcher.cancel(id);
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
