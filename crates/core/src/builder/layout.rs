//! Reshape, transpose, slice, concat and broadcast.

use super::GraphBuilder;
use crate::error::{shape_err, Result};
use crate::graph::NodeId;
use crate::op::Op;
use crate::tensor::numel;

impl GraphBuilder {
    pub fn reshape(&mut self, x: NodeId, shape: &[usize]) -> Result<NodeId> {
        let have = self.shape(x);
        if numel(have) != numel(shape) {
            return Err(shape_err("reshape", format!("cannot reshape {have:?} to {shape:?}")));
        }
        if have == shape {
            return Ok(x);
        }
        let dtype = self.dtype(x);
        Ok(self.push(Op::Reshape, vec![x], shape.to_vec(), dtype, "reshape"))
    }

    pub fn transpose(&mut self, x: NodeId, perm: &[usize]) -> Result<NodeId> {
        let have = self.shape(x).to_vec();
        let mut seen = vec![false; have.len()];
        let valid = perm.len() == have.len()
            && perm
                .iter()
                .all(|&p| p < have.len() && !std::mem::replace(&mut seen[p], true));
        if !valid {
            return Err(shape_err(
                "transpose",
                format!("{perm:?} is not a permutation of the axes of {have:?}"),
            ));
        }
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(x);
        }
        let shape = perm.iter().map(|&p| have[p]).collect();
        let dtype = self.dtype(x);
        Ok(self.push(
            Op::Transpose { perm: perm.to_vec() },
            vec![x],
            shape,
            dtype,
            "transpose",
        ))
    }

    /// Swaps two axes (negative axes count from the end).
    pub fn swap_axes(&mut self, x: NodeId, a: isize, b: isize) -> Result<NodeId> {
        let (a, b) = (self.axis("transpose", x, a)?, self.axis("transpose", x, b)?);
        let mut perm: Vec<usize> = (0..self.shape(x).len()).collect();
        perm.swap(a, b);
        self.transpose(x, &perm)
    }

    /// `x[start..end:step]` per axis.
    pub fn slice(&mut self, x: NodeId, start: &[usize], end: &[usize], step: &[usize]) -> Result<NodeId> {
        let have = self.shape(x).to_vec();
        let rank = have.len();
        if start.len() != rank || end.len() != rank || step.len() != rank {
            return Err(shape_err(
                "slice",
                format!("bounds for {} axes given for shape {have:?}", start.len()),
            ));
        }
        let mut shape = Vec::with_capacity(rank);
        for i in 0..rank {
            if step[i] == 0 || start[i] > end[i] || end[i] > have[i] {
                return Err(shape_err(
                    "slice",
                    format!(
                        "axis {i}: {}..{} step {} is not within {have:?}",
                        start[i], end[i], step[i]
                    ),
                ));
            }
            shape.push((end[i] - start[i]).div_ceil(step[i]));
        }
        if shape == have {
            return Ok(x);
        }
        let dtype = self.dtype(x);
        let op = Op::Slice {
            start: start.to_vec(),
            end: end.to_vec(),
            step: step.to_vec(),
        };
        Ok(self.push(op, vec![x], shape, dtype, "slice"))
    }

    /// `x[.., start..end, ..]` on one axis.
    pub fn slice_axis(&mut self, x: NodeId, axis: isize, start: usize, end: usize) -> Result<NodeId> {
        let axis = self.axis("slice", x, axis)?;
        let shape = self.shape(x).to_vec();
        let mut s = vec![0; shape.len()];
        let mut e = shape.clone();
        s[axis] = start;
        e[axis] = end;
        self.slice(x, &s, &e, &vec![1; shape.len()])
    }

    /// Joins along `axis`, promoting all parts to one dtype.
    pub fn concat(&mut self, xs: &[NodeId], axis: isize) -> Result<NodeId> {
        let Some(&first) = xs.first() else {
            return Err(shape_err("concat", "no inputs"));
        };
        let axis = self.axis("concat", first, axis)?;
        let base = self.shape(first).to_vec();
        let mut total = 0;
        for &x in xs {
            let s = self.shape(x);
            let fits = s.len() == base.len() && s.iter().zip(&base).enumerate().all(|(i, (a, b))| i == axis || a == b);
            if !fits {
                return Err(shape_err(
                    "concat",
                    format!("shape {s:?} does not fit {base:?} on axis {axis}"),
                ));
            }
            total += s[axis];
        }
        let mut dtype = self.dtype(first);
        for &x in &xs[1..] {
            dtype = self.promote2("concat", dtype, self.dtype(x))?;
        }
        let inputs: Vec<NodeId> = xs.iter().map(|&x| self.cast(x, dtype, "concat")).collect();
        let mut shape = base;
        shape[axis] = total;
        Ok(self.push(Op::Concat { axis }, inputs, shape, dtype, "concat"))
    }

    pub fn broadcast_to(&mut self, x: NodeId, shape: &[usize]) -> Result<NodeId> {
        self.broadcast(x, shape, "broadcast")
    }
}
