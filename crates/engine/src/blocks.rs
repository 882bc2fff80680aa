//! Bookkeeping of the paged KV cache: a pool of fixed-size blocks lent to sequences.
//!
//! The device holds the keys and values of every block in one state per layer; this pool only
//! decides which block holds which sequence's positions. Block 0 is never lent: padding rows of
//! a batch write there, and no real row reads it.

use std::collections::HashMap;

/// A sequence's handle in the pool.
pub type SeqId = u64;

#[derive(Debug)]
pub struct BlockPool {
    block_size: usize,
    /// Blocks lendable, `1..=total`.
    total: usize,
    free: Vec<u32>,
    tables: HashMap<SeqId, Vec<u32>>,
}

impl BlockPool {
    /// `blocks` lendable blocks of `block_size` positions (the device pool has one more).
    pub fn new(blocks: usize, block_size: usize) -> BlockPool {
        assert!(block_size > 0, "block size must be positive");
        BlockPool {
            block_size,
            total: blocks,
            // Popped from the back: lend low block numbers first.
            free: (1..=blocks as u32).rev().collect(),
            tables: HashMap::new(),
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn total_blocks(&self) -> usize {
        self.total
    }

    pub fn free_blocks(&self) -> usize {
        self.free.len()
    }

    /// Blocks that `positions` positions need.
    pub fn blocks_for(&self, positions: usize) -> usize {
        positions.div_ceil(self.block_size)
    }

    /// Whether `seq` could hold `positions` positions after lending what it lacks.
    pub fn can_hold(&self, seq: SeqId, positions: usize) -> bool {
        self.blocks_for(positions) <= self.held(seq) + self.free.len()
    }

    /// Grows `seq`'s table to hold `positions` positions; all or nothing. False when the pool
    /// lacks the blocks (nothing changes then).
    pub fn reserve(&mut self, seq: SeqId, positions: usize) -> bool {
        if !self.can_hold(seq, positions) {
            return false;
        }
        let need = self.blocks_for(positions);
        let table = self.tables.entry(seq).or_default();
        while table.len() < need {
            table.push(self.free.pop().expect("can_hold checked the free count"));
        }
        true
    }

    /// Returns every block of `seq` to the pool; how many it held.
    pub fn release(&mut self, seq: SeqId) -> usize {
        let table = self.tables.remove(&seq).unwrap_or_default();
        let n = table.len();
        self.free.extend(table.into_iter().rev());
        n
    }

    pub fn held(&self, seq: SeqId) -> usize {
        self.tables.get(&seq).map_or(0, Vec::len)
    }

    /// `seq`'s blocks in position order (empty when it holds none).
    pub fn table(&self, seq: SeqId) -> &[u32] {
        self.tables.get(&seq).map_or(&[], Vec::as_slice)
    }

    /// The pool slot (`block · block_size + offset`) of `seq`'s position `pos`.
    pub fn slot(&self, seq: SeqId, pos: usize) -> usize {
        let block = self.table(seq)[pos / self.block_size] as usize;
        block * self.block_size + pos % self.block_size
    }

    /// Sequences holding blocks.
    pub fn holders(&self) -> usize {
        self.tables.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lent(pool: &BlockPool) -> usize {
        pool.tables.values().map(Vec::len).sum()
    }

    #[test]
    fn reserve_lends_whole_blocks_and_release_returns_them() {
        let mut pool = BlockPool::new(8, 4);
        assert!(pool.reserve(1, 5)); // 2 blocks
        assert_eq!(pool.held(1), 2);
        assert_eq!(pool.table(1), &[1, 2]);
        assert!(pool.reserve(1, 8)); // still 2
        assert_eq!(pool.held(1), 2);
        assert!(pool.reserve(1, 9)); // 3
        assert_eq!(pool.table(1), &[1, 2, 3]);
        assert!(pool.reserve(2, 1));
        assert_eq!(pool.table(2), &[4]);
        assert_eq!(pool.free_blocks(), 4);
        assert_eq!(pool.release(1), 3);
        assert_eq!(pool.free_blocks(), 7);
        assert_eq!(pool.release(1), 0, "a second release frees nothing");
        assert_eq!(pool.release(2), 1);
        assert_eq!(pool.free_blocks(), 8);
        assert_eq!(pool.holders(), 0);
    }

    #[test]
    fn reserve_is_all_or_nothing_when_the_pool_is_short() {
        let mut pool = BlockPool::new(4, 2);
        assert!(pool.reserve(1, 5)); // 3 blocks
        assert!(!pool.can_hold(2, 3));
        assert!(!pool.reserve(2, 3), "needs 2, 1 free");
        assert_eq!(pool.held(2), 0);
        assert_eq!(pool.free_blocks(), 1);
        assert!(pool.reserve(2, 2));
        assert!(!pool.reserve(1, 7), "grow past the pool");
        assert_eq!(pool.held(1), 3);
        assert_eq!(pool.free_blocks(), 0);
    }

    #[test]
    fn slots_follow_the_table() {
        let mut pool = BlockPool::new(6, 4);
        assert!(pool.reserve(1, 4));
        assert!(pool.reserve(2, 4));
        assert!(pool.reserve(1, 8));
        assert_eq!(pool.table(1), &[1, 3]);
        assert_eq!(pool.slot(1, 0), 4);
        assert_eq!(pool.slot(1, 3), 7);
        assert_eq!(pool.slot(1, 4), 12);
        assert_eq!(pool.slot(2, 2), 10);
    }

    #[test]
    fn block_zero_is_never_lent() {
        let mut pool = BlockPool::new(5, 1);
        assert!(pool.reserve(1, 5));
        assert!(!pool.table(1).contains(&0));
        assert!(!pool.reserve(2, 1));
    }

    #[test]
    fn random_traffic_never_leaks_or_double_lends() {
        let mut rng = mlxcel_core::rng::SplitMix64(42);
        let mut pool = BlockPool::new(37, 3);
        let mut lengths: HashMap<SeqId, usize> = HashMap::new();
        for _ in 0..20_000 {
            let seq = rng.below(12);
            match rng.below(3) {
                0 => {
                    pool.release(seq);
                    lengths.remove(&seq);
                }
                _ => {
                    let want = lengths.get(&seq).copied().unwrap_or(0) + rng.below(7) as usize;
                    let before = pool.held(seq);
                    if pool.reserve(seq, want) {
                        lengths.insert(seq, want);
                        assert_eq!(pool.held(seq), pool.blocks_for(want).max(before));
                    } else {
                        assert_eq!(pool.held(seq), before);
                    }
                }
            }
            assert_eq!(lent(&pool) + pool.free_blocks(), 37);
            let mut all: Vec<u32> = pool
                .tables
                .values()
                .flatten()
                .copied()
                .chain(pool.free.iter().copied())
                .collect();
            all.sort();
            assert_eq!(
                all,
                (1..=37).collect::<Vec<u32>>(),
                "each block is in exactly one place"
            );
        }
        for seq in 0..12 {
            pool.release(seq);
        }
        assert_eq!(pool.free_blocks(), 37);
    }
}
