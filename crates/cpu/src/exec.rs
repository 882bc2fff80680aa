//! Dispatch from a node to its kernel.

use mlxcel_core::{DType, Error, Graph, Node, Op, Result};

use crate::buffer::{view, view_mut};
use crate::kernels::{attention, elementwise, index, layout, matmul, norm, quant, reduce, rope};

/// Everything the CPU can run; the error names the op and dtype it cannot.
pub fn check_supported(node: &Node) -> Result<()> {
    let ok = match &node.op {
        Op::Unary(u) => node.dtype.is_float() || (!u.needs_float() && node.dtype.is_integer()),
        Op::Binary(_) | Op::Reduce { .. } | Op::CumSum { .. } => {
            node.dtype != DType::Bool || node.op.name() == "argmax"
        }
        Op::Softmax { .. } | Op::RmsNorm { .. } | Op::LayerNorm { .. } | Op::Rope { .. } => node.dtype.is_float(),
        Op::MatMul { .. } | Op::QuantizedMatMul { .. } | Op::GatherQuantizedMatMul { .. } => node.dtype.is_float(),
        Op::Attention { .. } | Op::PagedAttention { .. } | Op::QuantizedGather { .. } => node.dtype.is_float(),
        _ => true,
    };
    if ok {
        Ok(())
    } else {
        Err(Error::Unsupported {
            backend: "cpu",
            op: format!("{} producing {}", node.op.name(), node.dtype),
        })
    }
}

fn reduce_dims(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product();
    (outer, shape[axis], inner)
}

/// Runs node `i` of `graph`; `ins[k]` holds the bytes of its k-th input (empty for the cache
/// a `KvWrite` updates in place, which is `out` itself).
pub fn execute(graph: &Graph, i: usize, ins: &[&[u8]], out: &mut [u8]) -> Result<()> {
    let node = &graph.nodes[i];
    let input = |k: usize| graph.node(node.inputs[k]);
    let v = |k: usize| view(ins[k], input(k).dtype);
    let shape = |k: usize| input(k).shape.as_slice();
    let o = view_mut(out, node.dtype);
    match &node.op {
        Op::Parameter { .. } | Op::Constant { .. } | Op::Input { .. } | Op::State { .. } | Op::Reshape => {
            unreachable!("leaves and views are not executed")
        }
        Op::Unary(op) => elementwise::unary(*op, v(0), o),
        Op::Binary(op) => elementwise::binary(*op, v(0), v(1), o),
        Op::Compare(op) => elementwise::compare(*op, v(0), v(1), o),
        Op::Where => elementwise::select(v(0), ins[1], ins[2], out, node.dtype.size()),
        Op::AsType => {
            mlxcel_core::tensor::convert_elements(input(0).dtype, ins[0], node.dtype, out);
            Ok(())
        }
        Op::Reduce { op, axis, .. } => reduce::reduce(*op, v(0), reduce_dims(shape(0), *axis), o),
        Op::Softmax { axis } => reduce::softmax(v(0), reduce_dims(shape(0), *axis), o),
        Op::CumSum { axis, reverse } => reduce::cumsum(v(0), reduce_dims(shape(0), *axis), *reverse, o),
        Op::MatMul { transpose_b } => matmul::matmul(v(0), shape(0), v(1), shape(1), *transpose_b, o),
        Op::QuantizedMatMul { bits, group_size } => {
            let q = quant::QWeight::new(ins[1], v(2), v(3), shape(1), *bits, *group_size);
            quant::qmm(v(0), &q, o)
        }
        Op::GatherQuantizedMatMul { bits, group_size } => {
            let q = quant::QWeight::new(ins[1], v(2), v(3), shape(1), *bits, *group_size);
            quant::gather_qmm(v(0), shape(0), &q, v(4), shape(4), o)
        }
        Op::QuantizedGather { bits, group_size } => {
            let q = quant::QWeight::new(ins[0], v(1), v(2), shape(0), *bits, *group_size);
            quant::gather_rows(&q, v(3), o)
        }
        Op::RmsNorm { eps, unit_offset } => norm::rms_norm(v(0), v(1), *eps, *unit_offset, o),
        Op::LayerNorm {
            eps,
            has_weight,
            has_bias,
        } => {
            let w = has_weight.then(|| v(1));
            let b = has_bias.then(|| v(1 + usize::from(*has_weight)));
            norm::layer_norm(v(0), *shape(0).last().unwrap(), w, b, *eps, o)
        }
        Op::Rope {
            dims,
            interleaved,
            scale,
        } => rope::rope(v(0), shape(0), v(1), shape(1), v(2), *dims, *interleaved, *scale, o),
        Op::Attention {
            scale,
            causal,
            window,
            softcap,
        } => {
            let p = attention::Params::new(*scale, *causal, *window, *softcap);
            attention::attention(v(0), shape(0), v(1), v(2), shape(1), shape(2)[3], v(3), &p, o)
        }
        Op::PagedAttention {
            scale,
            causal,
            window,
            softcap,
            block_size,
        } => {
            let p = attention::Params::new(*scale, *causal, *window, *softcap);
            let dv = shape(2)[2];
            let table = (v(4), shape(4));
            attention::paged_attention(
                v(0),
                shape(0),
                v(1),
                v(2),
                shape(1),
                dv,
                v(3),
                table,
                *block_size,
                &p,
                o,
            )
        }
        Op::KvWrite => attention::kv_write(out, &node.shape, ins[1], shape(1), v(2), node.dtype.size()),
        Op::Gather => index::gather(ins[0], shape(0), v(1), out, node.dtype.size()),
        Op::TakeAlongAxis { axis } => index::take_along_axis(
            ins[0],
            reduce_dims(shape(0), *axis),
            v(1),
            shape(1)[*axis],
            out,
            node.dtype.size(),
        ),
        Op::TopK { k, higher_on_ties } => index::topk(v(0), *shape(0).last().unwrap(), *k, *higher_on_ties, o),
        Op::ArgSort { descending } => index::argsort(v(0), *shape(0).last().unwrap(), *descending, o),
        Op::SampleCategorical { seed } => index::sample_categorical(v(0), shape(0), v(1), *seed, o),
        Op::Transpose { perm } => {
            layout::transpose(ins[0], shape(0), perm, out, node.dtype.size());
            Ok(())
        }
        Op::Slice { start, step, .. } => {
            layout::slice(ins[0], shape(0), start, step, &node.shape, out, node.dtype.size());
            Ok(())
        }
        Op::Concat { axis } => {
            let parts: Vec<(&[u8], &[usize])> = (0..ins.len()).map(|k| (ins[k], shape(k))).collect();
            layout::concat(&parts, *axis, &node.shape, out, node.dtype.size());
            Ok(())
        }
        Op::Broadcast => {
            layout::broadcast(ins[0], shape(0), &node.shape, out, node.dtype.size());
            Ok(())
        }
    }
}
