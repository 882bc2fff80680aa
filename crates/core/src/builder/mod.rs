//! Graph construction. Every call checks shapes, promotes dtypes by the MLX table, inserts
//! explicit `AsType` and `Broadcast` nodes where operands differ, and only then adds the node,
//! so backends never see mixed dtypes or shapes inside an elementwise op.

mod layout;
mod nn;

use crate::dtype::{at_least_float, promote, DType, Promotion, PromotionPolicy};
use crate::error::{shape_err, Error, Result};
use crate::graph::{Graph, Node, NodeId, NodeName};
use crate::op::{BinaryOp, CompareOp, Op, ReduceOp, UnaryOp};
use crate::tensor::HostTensor;

#[derive(Clone, Copy, Debug, Default)]
pub struct BuilderOptions {
    pub promotion: PromotionPolicy,
}

pub struct GraphBuilder {
    graph: Graph,
    options: BuilderOptions,
    layer: Option<u32>,
    /// The latest `KvWrite` of each state: writes to one state form a chain, and readers see
    /// the latest version, so the order of effects is the order of the graph.
    latest_write: std::collections::HashMap<NodeId, NodeId>,
}

impl Default for GraphBuilder {
    fn default() -> Self {
        GraphBuilder::new(BuilderOptions::default())
    }
}

impl GraphBuilder {
    pub fn new(options: BuilderOptions) -> GraphBuilder {
        GraphBuilder {
            graph: Graph::default(),
            options,
            layer: None,
            latest_write: Default::default(),
        }
    }

    pub fn options(&self) -> BuilderOptions {
        self.options
    }

    /// Nodes made from now on belong to `layer` (for names and AsType statistics).
    pub fn set_layer(&mut self, layer: Option<u32>) {
        self.layer = layer;
    }

    /// Names `x` (with the current layer) so its value can be dumped after a run.
    pub fn name(&mut self, x: NodeId, name: &str) -> NodeId {
        let layer = self.layer;
        self.graph.nodes[x.index()].name = Some(NodeName {
            layer,
            name: name.to_string(),
        });
        x
    }

    pub fn shape(&self, x: NodeId) -> &[usize] {
        &self.graph.node(x).shape
    }

    pub fn dtype(&self, x: NodeId) -> DType {
        self.graph.node(x).dtype
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    pub fn finish(mut self, outputs: &[NodeId]) -> Graph {
        self.graph.outputs = outputs.to_vec();
        self.graph
    }

    pub(crate) fn push(
        &mut self,
        op: Op,
        inputs: Vec<NodeId>,
        shape: Vec<usize>,
        dtype: DType,
        origin: &'static str,
    ) -> NodeId {
        let id = NodeId(self.graph.nodes.len() as u32);
        self.graph.nodes.push(Node {
            op,
            inputs,
            shape,
            dtype,
            layer: self.layer,
            name: None,
            origin,
        });
        id
    }

    fn promote2(&self, op: &'static str, a: DType, b: DType) -> Result<DType> {
        match promote(a, b, self.options.promotion) {
            Promotion::To(d) => Ok(d),
            Promotion::Unsupported(what) => Err(Error::DType(format!(
                "{op}: {} with {} promotes to {what} in MLX, which mlxcel does not support; cast one operand first",
                a.name(),
                b.name()
            ))),
        }
    }

    /// `x` converted to `dtype`, recording `origin` as the op that needed it.
    pub(crate) fn cast(&mut self, x: NodeId, dtype: DType, origin: &'static str) -> NodeId {
        if self.dtype(x) == dtype {
            return x;
        }
        let shape = self.shape(x).to_vec();
        self.push(Op::AsType, vec![x], shape, dtype, origin)
    }

    /// `x` stretched to `shape` by numpy rules (leading axes added by a reshape).
    pub(crate) fn broadcast(&mut self, x: NodeId, shape: &[usize], origin: &'static str) -> Result<NodeId> {
        let have = self.shape(x).to_vec();
        if have == shape {
            return Ok(x);
        }
        if have.len() > shape.len() {
            return Err(shape_err(origin, format!("cannot broadcast {have:?} to {shape:?}")));
        }
        let mut padded = vec![1; shape.len() - have.len()];
        padded.extend_from_slice(&have);
        if padded.iter().zip(shape).any(|(&h, &s)| h != s && h != 1) {
            return Err(shape_err(origin, format!("cannot broadcast {have:?} to {shape:?}")));
        }
        let x = if padded != have {
            let dtype = self.dtype(x);
            self.push(Op::Reshape, vec![x], padded.clone(), dtype, origin)
        } else {
            x
        };
        if padded == shape {
            return Ok(x);
        }
        let dtype = self.dtype(x);
        Ok(self.push(Op::Broadcast, vec![x], shape.to_vec(), dtype, origin))
    }

    /// Promotes and broadcasts operands to one dtype and shape.
    fn unify(&mut self, op: &'static str, xs: &[NodeId], dtype: Option<DType>) -> Result<Vec<NodeId>> {
        let dtype = match dtype {
            Some(d) => d,
            None => {
                let mut d = self.dtype(xs[0]);
                for &x in &xs[1..] {
                    d = self.promote2(op, d, self.dtype(x))?;
                }
                d
            }
        };
        let shapes: Vec<Vec<usize>> = xs.iter().map(|&x| self.shape(x).to_vec()).collect();
        let shape = broadcast_shapes(op, &shapes)?;
        xs.iter()
            .map(|&x| {
                let x = self.cast(x, dtype, op);
                self.broadcast(x, &shape, op)
            })
            .collect()
    }

    // ---- leaves ----

    pub fn parameter(&mut self, name: &str, data: HostTensor) -> NodeId {
        let (shape, dtype) = (data.shape.clone(), data.dtype);
        self.push(
            Op::Parameter {
                name: name.to_string(),
                data,
            },
            vec![],
            shape,
            dtype,
            "parameter",
        )
    }

    pub fn constant(&mut self, data: HostTensor) -> NodeId {
        let (shape, dtype) = (data.shape.clone(), data.dtype);
        self.push(Op::Constant { data }, vec![], shape, dtype, "constant")
    }

    pub fn scalar(&mut self, value: f32, dtype: DType) -> NodeId {
        self.constant(HostTensor::scalar_f32(dtype, value))
    }

    pub fn input(&mut self, name: &str, dtype: DType, shape: &[usize]) -> NodeId {
        self.push(
            Op::Input { name: name.to_string() },
            vec![],
            shape.to_vec(),
            dtype,
            "input",
        )
    }

    pub fn state(&mut self, name: &str, dtype: DType, shape: &[usize]) -> NodeId {
        self.push(
            Op::State { name: name.to_string() },
            vec![],
            shape.to_vec(),
            dtype,
            "state",
        )
    }

    // ---- elementwise ----

    pub fn unary(&mut self, op: UnaryOp, x: NodeId) -> Result<NodeId> {
        let name = Op::Unary(op).name();
        let d = self.dtype(x);
        if d == DType::Bool {
            return Err(Error::DType(format!("{name}: bool operand; cast it first")));
        }
        if op == UnaryOp::Neg && matches!(d, DType::U32 | DType::U8) {
            return Err(Error::DType(format!("{name}: negating an unsigned {d} tensor")));
        }
        let dtype = if op.needs_float() { at_least_float(d) } else { d };
        let x = self.cast(x, dtype, name);
        let shape = self.shape(x).to_vec();
        Ok(self.push(Op::Unary(op), vec![x], shape, dtype, name))
    }

    pub fn binary(&mut self, op: BinaryOp, a: NodeId, b: NodeId) -> Result<NodeId> {
        let name = Op::Binary(op).name();
        if self.dtype(a) == DType::Bool || self.dtype(b) == DType::Bool {
            return Err(Error::DType(format!("{name}: bool operand; cast it first")));
        }
        let mut dtype = self.promote2(name, self.dtype(a), self.dtype(b))?;
        if op == BinaryOp::Div {
            dtype = at_least_float(dtype);
        }
        let xs = self.unify(name, &[a, b], Some(dtype))?;
        let shape = self.shape(xs[0]).to_vec();
        Ok(self.push(Op::Binary(op), xs, shape, dtype, name))
    }

    pub fn compare(&mut self, op: CompareOp, a: NodeId, b: NodeId) -> Result<NodeId> {
        let name = Op::Compare(op).name();
        let xs = self.unify(name, &[a, b], None)?;
        let shape = self.shape(xs[0]).to_vec();
        Ok(self.push(Op::Compare(op), xs, shape, DType::Bool, name))
    }

    /// `cond ? a : b`, with `a` and `b` promoted together.
    pub fn where_(&mut self, cond: NodeId, a: NodeId, b: NodeId) -> Result<NodeId> {
        if self.dtype(cond) != DType::Bool {
            return Err(Error::DType(format!(
                "where: condition is {}, expected bool",
                self.dtype(cond)
            )));
        }
        let dtype = self.promote2("where", self.dtype(a), self.dtype(b))?;
        let shapes: Vec<Vec<usize>> = [cond, a, b].iter().map(|&x| self.shape(x).to_vec()).collect();
        let shape = broadcast_shapes("where", &shapes)?;
        let cond = self.broadcast(cond, &shape, "where")?;
        let a = self.cast(a, dtype, "where");
        let a = self.broadcast(a, &shape, "where")?;
        let b = self.cast(b, dtype, "where");
        let b = self.broadcast(b, &shape, "where")?;
        Ok(self.push(Op::Where, vec![cond, a, b], shape, dtype, "where"))
    }

    /// Explicit conversion; a no-op (no node) when `x` already has `dtype`.
    pub fn astype(&mut self, x: NodeId, dtype: DType) -> NodeId {
        self.cast(x, dtype, "astype")
    }

    pub fn add(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.binary(BinaryOp::Add, a, b)
    }
    pub fn sub(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.binary(BinaryOp::Sub, a, b)
    }
    pub fn mul(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.binary(BinaryOp::Mul, a, b)
    }
    pub fn div(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.binary(BinaryOp::Div, a, b)
    }
    pub fn maximum(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.binary(BinaryOp::Maximum, a, b)
    }
    pub fn minimum(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.binary(BinaryOp::Minimum, a, b)
    }

    /// A Python-style ("weak") scalar: it takes `x`'s dtype instead of promoting it, except
    /// that a fractional value with an integer tensor is f32 (as `int_array * 0.5` is in MLX).
    pub fn weak_scalar(&mut self, x: NodeId, value: f32) -> NodeId {
        let dtype = self.dtype(x);
        let dtype = if !dtype.is_float() && value.fract() != 0.0 {
            DType::F32
        } else {
            dtype
        };
        self.scalar(value, dtype)
    }
    pub fn mul_scalar(&mut self, x: NodeId, value: f32) -> Result<NodeId> {
        let s = self.weak_scalar(x, value);
        self.mul(x, s)
    }
    pub fn add_scalar(&mut self, x: NodeId, value: f32) -> Result<NodeId> {
        let s = self.weak_scalar(x, value);
        self.add(x, s)
    }

    pub fn silu(&mut self, x: NodeId) -> Result<NodeId> {
        self.unary(UnaryOp::Silu, x)
    }
    pub fn exp(&mut self, x: NodeId) -> Result<NodeId> {
        self.unary(UnaryOp::Exp, x)
    }

    // ---- reductions ----

    pub(crate) fn axis(&self, op: &'static str, x: NodeId, axis: isize) -> Result<usize> {
        let rank = self.shape(x).len() as isize;
        let a = if axis < 0 { axis + rank } else { axis };
        if a < 0 || a >= rank {
            return Err(shape_err(
                op,
                format!("axis {axis} out of range for shape {:?}", self.shape(x)),
            ));
        }
        Ok(a as usize)
    }

    pub fn reduce(&mut self, op: ReduceOp, x: NodeId, axis: isize, keepdims: bool) -> Result<NodeId> {
        let name = Op::Reduce { op, axis: 0, keepdims }.name();
        let axis = self.axis(name, x, axis)?;
        let d = self.dtype(x);
        if self.shape(x)[axis] == 0 {
            return Err(shape_err(
                name,
                format!("reducing an empty axis of {:?}", self.shape(x)),
            ));
        }
        let (x, dtype) = match op {
            ReduceOp::ArgMax => (x, DType::U32),
            ReduceOp::LogSumExp => {
                let f = at_least_float(d);
                (self.cast(x, f, name), f)
            }
            _ if d == DType::Bool => return Err(Error::DType(format!("{name}: bool operand"))),
            _ => (x, d),
        };
        let mut shape = self.shape(x).to_vec();
        if keepdims {
            shape[axis] = 1;
        } else {
            shape.remove(axis);
        }
        Ok(self.push(Op::Reduce { op, axis, keepdims }, vec![x], shape, dtype, name))
    }

    pub fn sum(&mut self, x: NodeId, axis: isize, keepdims: bool) -> Result<NodeId> {
        self.reduce(ReduceOp::Sum, x, axis, keepdims)
    }
    pub fn argmax(&mut self, x: NodeId, axis: isize) -> Result<NodeId> {
        self.reduce(ReduceOp::ArgMax, x, axis, false)
    }

    /// Softmax in f32 inside the kernel; output keeps `x`'s (float) dtype.
    pub fn softmax(&mut self, x: NodeId, axis: isize) -> Result<NodeId> {
        let axis = self.axis("softmax", x, axis)?;
        let dtype = at_least_float(self.dtype(x));
        let x = self.cast(x, dtype, "softmax");
        let shape = self.shape(x).to_vec();
        Ok(self.push(Op::Softmax { axis }, vec![x], shape, dtype, "softmax"))
    }

    pub fn cumsum(&mut self, x: NodeId, axis: isize, reverse: bool) -> Result<NodeId> {
        let axis = self.axis("cumsum", x, axis)?;
        let dtype = self.dtype(x);
        if dtype == DType::Bool {
            return Err(Error::DType("cumsum: bool operand; cast it first".into()));
        }
        let shape = self.shape(x).to_vec();
        Ok(self.push(Op::CumSum { axis, reverse }, vec![x], shape, dtype, "cumsum"))
    }
}

/// Numpy broadcasting of several shapes.
pub fn broadcast_shapes(op: &'static str, shapes: &[Vec<usize>]) -> Result<Vec<usize>> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; rank];
    for s in shapes {
        for (i, &d) in s.iter().enumerate() {
            let o = &mut out[rank - s.len() + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return Err(shape_err(op, format!("shapes {shapes:?} do not broadcast")));
            }
        }
    }
    Ok(out)
}
