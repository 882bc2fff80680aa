//! Batched steps over the paged KV cache: one session, step graphs planned once per
//! (batch bucket, tokens per row, table width, head) and replayed; the least recently used
//! is unloaded past a cap (prompt lengths vary, and every graph holds its own buffers).

use std::collections::HashMap;

use anyhow::{ensure, Result};
use mlxcel_core::passes::{default_passes, run_passes};
use mlxcel_core::{Backend, CompileOptions, DType, GraphBuilder, GraphId, HostTensor, ReduceOp, Session};
use mlxcel_models::{PagedStep, Transformer};

/// One row of a step: `tokens` at positions `start..`, its keys and values in the blocks of
/// `table` (which must cover `start + tokens.len()` positions).
#[derive(Clone, Copy, Debug)]
pub struct Row<'a> {
    pub tokens: &'a [u32],
    pub start: usize,
    pub table: &'a [u32],
}

/// What a step returns per real row.
#[derive(Debug)]
pub struct StepOutput {
    /// First maximum of each row's last-position logits.
    pub argmax: Vec<u32>,
    /// Each row's last-position logits (f32), when asked for.
    pub logits: Option<Vec<Vec<f32>>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    batch: usize,
    tokens: usize,
    table: usize,
    logits: bool,
}

pub struct PagedEngine {
    model: Transformer,
    session: Box<dyn Session>,
    dtype: DType,
    block_size: usize,
    /// Device pool blocks, block 0 included.
    pool_blocks: usize,
    /// Table width covering the largest context.
    max_table: usize,
    /// Loaded step graphs and the step that last used each.
    graphs: HashMap<Key, (GraphId, u64)>,
    /// Most graphs kept loaded.
    max_graphs: usize,
    steps: u64,
}

/// Step graphs a [`PagedEngine`] keeps loaded by default.
pub const DEFAULT_MAX_GRAPHS: usize = 32;

/// Batch sizes that get their own graph; a batch pads up to the next one.
pub fn batch_bucket(n: usize) -> usize {
    n.max(1).next_power_of_two()
}

impl PagedEngine {
    /// A pool of `blocks` lendable blocks of `block_size` positions; rows up to `max_context`.
    pub fn new(
        model: Transformer,
        backend: &dyn Backend,
        dtype: DType,
        blocks: usize,
        block_size: usize,
        max_context: usize,
    ) -> Result<PagedEngine> {
        ensure!(blocks > 0 && block_size > 0, "the KV pool needs at least one block");
        Ok(PagedEngine {
            model,
            session: backend.new_session()?,
            dtype,
            block_size,
            pool_blocks: blocks + 1,
            max_table: max_context.div_ceil(block_size),
            graphs: HashMap::new(),
            max_graphs: DEFAULT_MAX_GRAPHS,
            steps: 0,
        })
    }

    /// Keeps at most `n` step graphs loaded (at least one), unloading the least recently used.
    pub fn with_max_graphs(mut self, n: usize) -> PagedEngine {
        self.max_graphs = n.max(1);
        self
    }

    /// Step graphs loaded now.
    pub fn graphs_loaded(&self) -> usize {
        self.graphs.len()
    }

    pub fn model(&self) -> &Transformer {
        &self.model
    }

    pub fn memory(&self) -> mlxcel_core::MemoryReport {
        self.session.memory()
    }

    /// Runs `rows` (all with the same token count) as one batch, padded to its bucket.
    pub fn step(&mut self, rows: &[Row], logits: bool) -> Result<StepOutput> {
        ensure!(!rows.is_empty(), "a step needs at least one row");
        let t = rows[0].tokens.len();
        ensure!(
            t > 0 && rows.iter().all(|r| r.tokens.len() == t),
            "rows of one step must have the same positive length"
        );
        let bs = self.block_size;
        let batch = if t == 1 { batch_bucket(rows.len()) } else { rows.len() };
        let need = rows.iter().map(|r| (r.start + t).div_ceil(bs)).max().unwrap_or(1);
        ensure!(need <= self.max_table, "a row exceeds the context");
        let table = need.next_power_of_two().min(self.max_table).max(need);
        let mut slots = Vec::new();
        let mut tokens = vec![0i32; batch * t];
        let mut positions = vec![0i32; batch * t];
        let mut kv_len = vec![t as i32; batch];
        let mut tables = vec![0i32; batch * table];
        for (r, row) in rows.iter().enumerate() {
            ensure!(
                row.table.len() * bs >= row.start + t,
                "row {r}: the block table does not cover the step"
            );
            for (j, &id) in row.tokens.iter().enumerate() {
                tokens[r * t + j] = id as i32;
                positions[r * t + j] = (row.start + j) as i32;
            }
            kv_len[r] = (row.start + t) as i32;
            for (j, &blk) in row.table.iter().take(table).enumerate() {
                tables[r * table + j] = blk as i32;
            }
            for pos in row.start..row.start + t {
                slots.push((row.table[pos / bs] as usize * bs + pos % bs) as i32);
            }
        }
        // Padding rows write their one token into block 0 and attend to it alone.
        slots.resize(batch * t, 0);
        let key = Key {
            batch,
            tokens: t,
            table,
            logits,
        };
        let id = self.graph(&key)?;
        let inputs = [
            HostTensor::from_slice(&[batch, t], &tokens)?,
            HostTensor::from_slice(&[batch, t], &positions)?,
            HostTensor::from_slice(&[batch], &kv_len)?,
            HostTensor::from_slice(&[batch, table], &tables)?,
            HostTensor::from_slice(&[slots.len()], &slots)?,
        ];
        let out = self.session.run(id, &inputs)?;
        let mut argmax = out[0].to_vec::<u32>()?;
        argmax.truncate(rows.len());
        let logits = if logits {
            let v = self.model.spec.vocab;
            let all = out[1].to_vec::<f32>()?;
            Some(all.chunks(v).take(rows.len()).map(<[f32]>::to_vec).collect())
        } else {
            None
        };
        Ok(StepOutput { argmax, logits })
    }

    fn graph(&mut self, key: &Key) -> Result<GraphId> {
        self.steps += 1;
        if let Some((id, used)) = self.graphs.get_mut(key) {
            *used = self.steps;
            return Ok(*id);
        }
        while self.graphs.len() >= self.max_graphs {
            let oldest = self
                .graphs
                .iter()
                .min_by_key(|(_, &(_, used))| used)
                .map(|(k, _)| k.clone());
            let Some(oldest) = oldest else { break };
            let (id, _) = self.graphs.remove(&oldest).expect("a loaded key");
            self.session.unload(id)?;
        }
        let shape = StepShape {
            batch: key.batch,
            tokens: key.tokens,
            table: key.table,
            pool_blocks: self.pool_blocks,
            block_size: self.block_size,
        };
        let graph = step_graph(&self.model, self.dtype, &shape, key.logits)?;
        let id = self.session.load(&graph, CompileOptions::default())?;
        self.graphs.insert(key.clone(), (id, self.steps));
        Ok(id)
    }
}

/// The layout of one batched step over the paged pool.
pub struct StepShape {
    pub batch: usize,
    pub tokens: usize,
    /// Block-table width (blocks a row).
    pub table: usize,
    /// Pool blocks, the never-lent block 0 included.
    pub pool_blocks: usize,
    pub block_size: usize,
}

impl StepShape {
    /// A decode step of `batch` rows (one token each), rows up to `context` positions.
    pub fn decode(batch: usize, context: usize, block_size: usize) -> StepShape {
        let table = context.div_ceil(block_size).max(1);
        StepShape {
            batch,
            tokens: 1,
            table,
            pool_blocks: batch * table + 1,
            block_size,
        }
    }
}

/// `MLXCEL_PAGED_ATTENTION=0`: decode steps gather each row's blocks into a dense cache, as
/// prefill chunks do, instead of attending over the pool in place (for comparison).
fn in_place_attention() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MLXCEL_PAGED_ATTENTION").map_or(true, |v| v != "0"))
}

/// The step graph the engine plans for `shape`: each row's last-position argmax (and its f32
/// logits when `logits`), after the passes.
pub fn step_graph(model: &Transformer, dtype: DType, shape: &StepShape, logits: bool) -> Result<mlxcel_core::Graph> {
    let (batch, t) = (shape.batch, shape.tokens);
    let mut b = GraphBuilder::default();
    let step = PagedStep {
        tokens: b.input("tokens", DType::I32, &[batch, t]),
        positions: b.input("positions", DType::I32, &[batch, t]),
        kv_len: b.input("kv_len", DType::I32, &[batch]),
        block_table: b.input("block_table", DType::I32, &[batch, shape.table]),
        write_slots: b.input("write_slots", DType::I32, &[batch * t]),
        pool_blocks: shape.pool_blocks,
        block_size: shape.block_size,
        dtype,
        in_place: in_place_attention(),
    };
    let out = model.forward_paged(&mut b, &step)?;
    let vocab = model.spec.vocab;
    let out = b.reshape(out, &[batch, vocab])?;
    let out = b.astype(out, DType::F32);
    let argmax = b.reduce(ReduceOp::ArgMax, out, -1, false)?;
    let outputs = if logits { vec![argmax, out] } else { vec![argmax] };
    Ok(run_passes(&b.finish(&outputs), &default_passes())?)
}
