//! Memory planning, shared by backends: every value gets a location once, when the graph is
//! loaded. Activations share a small pool of slots by liveness; reshapes alias their input;
//! cache writes alias their state; leaves keep their own buffers.

use crate::{Graph, Op};

/// Where a node's value lives during a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loc {
    /// Pool slot shared by values whose lifetimes do not overlap.
    Slot(usize),
    /// Parameter or constant `i` of the graph.
    Leaf(usize),
    /// Session state `i`.
    State(usize),
}

#[derive(Debug)]
pub struct Plan {
    pub locs: Vec<Loc>,
    /// Bytes each slot needs (the largest value assigned to it).
    pub slot_bytes: Vec<usize>,
}

/// The node whose buffer `id` uses: itself, or what it aliases.
fn root(graph: &Graph, roots: &[usize], i: usize) -> usize {
    let node = &graph.nodes[i];
    match node.op {
        Op::Reshape | Op::KvWrite => roots[node.inputs[0].index()],
        _ => i,
    }
}

/// With `keep_named`, named values live to the end of the run (for dumps). `state_index(i)`
/// maps a state node to the session's state number; `leaf_index(i)` a
/// parameter or constant node to its leaf number.
pub fn plan(
    graph: &Graph,
    keep_named: bool,
    state_index: impl Fn(usize) -> usize,
    leaf_index: impl Fn(usize) -> usize,
) -> Plan {
    let n = graph.nodes.len();
    let mut roots = Vec::with_capacity(n);
    for i in 0..n {
        let r = root(graph, &roots, i);
        roots.push(r);
    }
    // A buffer lives until the last use of any value stored in it.
    let last_use = graph.last_uses();
    let mut end = vec![0usize; n];
    for i in 0..n {
        let r = roots[i];
        // Named values stay readable after the run when the caller asks for them.
        let keep = keep_named && graph.nodes[i].name.is_some();
        let until = if keep { usize::MAX } else { last_use[i] };
        end[r] = end[r].max(until);
    }
    let mut locs = vec![Loc::Slot(usize::MAX); n];
    let mut slot_bytes: Vec<usize> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    // Slots to release after node i runs.
    let mut release: Vec<Vec<usize>> = vec![Vec::new(); n];
    // Backends copy every input in before the first kernel runs, so an input's slot is taken
    // from the start: one declared late (a target, a sampler scalar) must not share a slot
    // with a value computed before its node.
    for (i, node) in graph.nodes.iter().enumerate() {
        if matches!(node.op, Op::Input { .. }) {
            let bytes = node.shape.iter().product::<usize>() * node.dtype.size();
            let slot = take_slot(&mut free, &mut slot_bytes, bytes);
            if end[i] != usize::MAX {
                release[end[i].max(i)].push(slot);
            }
            locs[i] = Loc::Slot(slot);
        }
    }
    for i in 0..n {
        let node = &graph.nodes[i];
        if matches!(node.op, Op::Input { .. }) {
            free.append(&mut release[i]);
            continue;
        }
        locs[i] = if roots[i] != i {
            locs[roots[i]]
        } else {
            match node.op {
                Op::Parameter { .. } | Op::Constant { .. } => Loc::Leaf(leaf_index(i)),
                Op::State { .. } => Loc::State(state_index(i)),
                _ => {
                    let bytes = node.shape.iter().product::<usize>() * node.dtype.size();
                    let slot = take_slot(&mut free, &mut slot_bytes, bytes);
                    if end[i] != usize::MAX {
                        release[end[i].max(i)].push(slot);
                    }
                    Loc::Slot(slot)
                }
            }
        };
        // Release after allocating, so an output never shares a slot with its own inputs.
        free.append(&mut release[i]);
    }
    Plan { locs, slot_bytes }
}

/// Best fit among free slots; otherwise grow the largest free slot, or open a new one.
fn take_slot(free: &mut Vec<usize>, slot_bytes: &mut Vec<usize>, bytes: usize) -> usize {
    let fit = free
        .iter()
        .enumerate()
        .filter(|(_, &s)| slot_bytes[s] >= bytes)
        .min_by_key(|(_, &s)| slot_bytes[s])
        .map(|(k, _)| k);
    let pick = fit.or_else(|| (0..free.len()).max_by_key(|&k| slot_bytes[free[k]]));
    match pick {
        Some(k) => {
            let s = free.swap_remove(k);
            slot_bytes[s] = slot_bytes[s].max(bytes);
            s
        }
        None => {
            slot_bytes.push(bytes);
            slot_bytes.len() - 1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, GraphBuilder};

    #[test]
    fn a_chain_reuses_two_slots() {
        let mut b = GraphBuilder::default();
        let mut x = b.input("x", DType::F32, &[64]);
        for _ in 0..10 {
            x = b.exp(x).unwrap();
        }
        let g = b.finish(&[x]);
        let p = plan(&g, false, |_| 0, |_| 0);
        assert_eq!(p.slot_bytes.len(), 2, "{p:?}");
        for (i, node) in g.nodes.iter().enumerate().skip(1) {
            assert_ne!(
                p.locs[i],
                p.locs[node.inputs[0].index()],
                "node {i} overwrites its input"
            );
        }
    }

    #[test]
    fn a_reshape_keeps_its_source_alive() {
        let mut b = GraphBuilder::default();
        let x = b.input("x", DType::F32, &[4, 4]);
        let y = b.exp(x).unwrap();
        let r = b.reshape(y, &[16]).unwrap();
        let z = b.exp(x).unwrap(); // must not land in y's slot: r still reads it
        let z = b.reshape(z, &[16]).unwrap();
        let out = b.add(z, r).unwrap();
        let g = b.finish(&[out]);
        let p = plan(&g, false, |_| 0, |_| 0);
        assert_eq!(p.locs[r.index()], p.locs[y.index()]);
        assert_ne!(p.locs[z.index()], p.locs[y.index()]);
    }

    #[test]
    fn a_late_input_never_shares_a_slot_with_earlier_values() {
        // Inputs are copied in before any kernel runs, so "t" (declared after the chain) must
        // not take a slot the chain has already finished with.
        let mut b = GraphBuilder::default();
        let x = b.input("x", DType::F32, &[64]);
        let mut y = x;
        let mut chain = Vec::new();
        for _ in 0..6 {
            y = b.exp(y).unwrap();
            chain.push(y);
        }
        let t = b.input("t", DType::F32, &[64]);
        let out = b.add(y, t).unwrap();
        let g = b.finish(&[out]);
        let p = plan(&g, false, |_| 0, |_| 0);
        for v in chain.iter().chain([&x]) {
            assert_ne!(
                p.locs[t.index()],
                p.locs[v.index()],
                "input t shares node {}'s slot",
                v.index()
            );
        }
    }
}
