//! Layers shared by every architecture: linear (dense or affine-quantized, decided by the
//! loader), embedding, RMSNorm, RoPE frequency tables.

use anyhow::{ensure, Result};
use mlxcel_core::{DType, GraphBuilder, HostTensor, NodeId};

use crate::checkpoint::Checkpoint;
use crate::quant::{QuantConfig, QuantParams};

/// Reads weights by checkpoint name and decides dense versus quantized per module.
pub struct Loader {
    pub checkpoint: Checkpoint,
    pub quant: QuantConfig,
}

#[derive(Clone)]
pub(crate) enum Weight {
    Dense(HostTensor),
    Quantized {
        w: HostTensor,
        scales: HostTensor,
        biases: HostTensor,
        q: QuantParams,
    },
}

/// `y = x Wᵀ (+ b)` for `W [out, in]`.
#[derive(Clone)]
pub struct Linear {
    name: String,
    weight: Weight,
    bias: Option<HostTensor>,
}

impl Loader {
    pub(crate) fn weight(&self, prefix: &str, rows: usize, cols: usize) -> Result<Weight> {
        self.stacked_weight(prefix, &[], rows, cols)
    }

    /// A weight `[lead.., rows, cols]` (e.g. experts stacked on a leading axis), dense or
    /// quantized along `cols`.
    pub(crate) fn stacked_weight(&self, prefix: &str, lead: &[usize], rows: usize, cols: usize) -> Result<Weight> {
        let ck = &self.checkpoint;
        let shape = |tail: &[usize]| [lead, tail].concat();
        let scales = format!("{prefix}.scales");
        if !ck.contains(&scales) {
            return Ok(Weight::Dense(
                ck.get_shaped(&format!("{prefix}.weight"), &shape(&[rows, cols]))?,
            ));
        }
        let q = self.quant.for_module(prefix).ok_or_else(|| {
            anyhow::anyhow!(
                "bad quantization config: {prefix} is stored quantized but config.json gives it no quantization parameters"
            )
        })?;
        ensure!(
            cols.is_multiple_of(q.group_size),
            "bad quantization config: {prefix} has {cols} inputs, not a multiple of group size {}",
            q.group_size
        );
        let groups = shape(&[rows, cols / q.group_size]);
        let w = ck.get_shaped(
            &format!("{prefix}.weight"),
            &shape(&[rows, cols * q.bits as usize / 32]),
        );
        let w = w.map_err(|e| anyhow::anyhow!("{e} (for {}-bit, group {} quantization)", q.bits, q.group_size))?;
        ensure!(
            w.dtype == DType::U32,
            "tensor {prefix}.weight: quantized weights must be uint32, found {}",
            w.dtype
        );
        let scales = ck.get_shaped(&scales, &groups)?;
        let biases = ck.get_shaped(&format!("{prefix}.biases"), &groups)?;
        Ok(Weight::Quantized { w, scales, biases, q })
    }

    /// The linear layer at `prefix` (`{prefix}.weight`, and `.scales`/`.biases` if quantized).
    pub fn linear(&self, prefix: &str, inputs: usize, outputs: usize, bias: bool) -> Result<Linear> {
        let weight = self.weight(prefix, outputs, inputs)?;
        let bias = if bias {
            Some(self.checkpoint.get_shaped(&format!("{prefix}.bias"), &[outputs])?)
        } else {
            None
        };
        Ok(Linear {
            name: prefix.to_string(),
            weight,
            bias,
        })
    }

    pub fn embedding(&self, prefix: &str, vocab: usize, dim: usize) -> Result<Embedding> {
        Ok(Embedding {
            name: prefix.to_string(),
            weight: self.weight(prefix, vocab, dim)?,
        })
    }

    pub fn rms_norm(&self, prefix: &str, dim: usize, eps: f32) -> Result<RmsNorm> {
        Ok(RmsNorm {
            name: prefix.to_string(),
            weight: self.checkpoint.get_shaped(&format!("{prefix}.weight"), &[dim])?,
            eps,
            unit_offset: false,
        })
    }
}

fn matmul(b: &mut GraphBuilder, name: &str, weight: &Weight, x: NodeId) -> Result<NodeId> {
    Ok(match weight {
        Weight::Dense(w) => {
            let w = b.parameter(&format!("{name}.weight"), w.clone());
            b.matmul_t(x, w)?
        }
        Weight::Quantized { w, scales, biases, q } => {
            let w = b.parameter(&format!("{name}.weight"), w.clone());
            let s = b.parameter(&format!("{name}.scales"), scales.clone());
            let z = b.parameter(&format!("{name}.biases"), biases.clone());
            b.quantized_matmul(x, w, s, z, q.bits, q.group_size)?
        }
    })
}

impl Linear {
    pub fn forward(&self, b: &mut GraphBuilder, x: NodeId) -> Result<NodeId> {
        let y = self.product(b, x)?;
        self.add_bias(b, y)
    }

    /// `x · Wᵀ` without the bias: [`Linear::forward`] in two steps, for callers that put
    /// several products of one x next to each other in the graph (a backend may fuse them).
    pub fn product(&self, b: &mut GraphBuilder, x: NodeId) -> Result<NodeId> {
        matmul(b, &self.name, &self.weight, x)
    }

    /// `y + bias`, or `y` for a layer without one.
    pub fn add_bias(&self, b: &mut GraphBuilder, y: NodeId) -> Result<NodeId> {
        match &self.bias {
            Some(bias) => {
                let bias = b.parameter(&format!("{}.bias", self.name), bias.clone());
                Ok(b.add(y, bias)?)
            }
            None => Ok(y),
        }
    }
}

/// Token embedding `[vocab, dim]`, dense or quantized; also usable as a tied output head.
#[derive(Clone)]
pub struct Embedding {
    name: String,
    weight: Weight,
}

impl Embedding {
    /// `ids [..]` → `[.., dim]` in `dtype`.
    pub fn lookup(&self, b: &mut GraphBuilder, ids: NodeId, dtype: DType) -> Result<NodeId> {
        Ok(match &self.weight {
            Weight::Dense(t) => {
                let t = b.parameter(&format!("{}.weight", self.name), t.clone());
                let rows = b.gather(t, ids)?;
                b.astype(rows, dtype)
            }
            Weight::Quantized { w, scales, biases, q } => {
                let w = b.parameter(&format!("{}.weight", self.name), w.clone());
                let s = b.parameter(&format!("{}.scales", self.name), scales.clone());
                let z = b.parameter(&format!("{}.biases", self.name), biases.clone());
                b.quantized_gather_as(w, s, z, ids, q.bits, q.group_size, dtype)?
            }
        })
    }

    /// The dtype MLX gives looked-up rows: the table's, or the quantization scales'.
    pub fn dtype(&self) -> DType {
        match &self.weight {
            Weight::Dense(t) => t.dtype,
            Weight::Quantized { scales, .. } => scales.dtype,
        }
    }

    /// `x [.., dim]` → logits `[.., vocab]` with the embedding as the output matrix.
    pub fn as_linear(&self, b: &mut GraphBuilder, x: NodeId) -> Result<NodeId> {
        matmul(b, &self.name, &self.weight, x)
    }
}

#[derive(Clone)]
pub struct RmsNorm {
    name: String,
    weight: HostTensor,
    eps: f32,
    /// Scale by `1 + w` (Gemma) instead of `w`.
    unit_offset: bool,
}

impl RmsNorm {
    pub fn unit_offset(self, on: bool) -> RmsNorm {
        RmsNorm {
            unit_offset: on,
            ..self
        }
    }

    pub fn forward(&self, b: &mut GraphBuilder, x: NodeId) -> Result<NodeId> {
        let w = b.parameter(&format!("{}.weight", self.name), self.weight.clone());
        Ok(b.rms_norm(x, w, self.eps, self.unit_offset)?)
    }
}

/// Rotary embedding settings: inverse frequencies for the rotated channels.
#[derive(Clone, Debug)]
pub struct Rope {
    pub dims: usize,
    pub inv_freq: Vec<f32>,
    pub interleaved: bool,
    /// Positions are multiplied by this (linear scaling uses `1 / factor`).
    pub scale: f32,
}

/// Llama 3 frequency scaling (`rope_scaling.rope_type == "llama3"`).
#[derive(Clone, Copy, Debug)]
pub struct Llama3Scaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_position_embeddings: f32,
}

impl Rope {
    /// `inv_freq[i] = base^(-2i/dims)`.
    pub fn new(dims: usize, base: f32, interleaved: bool) -> Rope {
        let inv_freq = (0..dims / 2)
            .map(|i| (base as f64).powf(-2.0 * i as f64 / dims as f64) as f32)
            .collect();
        Rope {
            dims,
            inv_freq,
            interleaved,
            scale: 1.0,
        }
    }

    /// Llama 3: long wavelengths slowed by `factor`, short ones kept, the band between blended.
    pub fn llama3(dims: usize, base: f32, s: Llama3Scaling) -> Rope {
        let low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
        let high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
        let inv_freq = Rope::new(dims, base, false)
            .inv_freq
            .iter()
            .map(|&inv| {
                let period = 1.0 / inv;
                let wavelen = 2.0 * std::f32::consts::PI * period;
                let period = if wavelen > low_wavelen {
                    period * s.factor
                } else if wavelen > high_wavelen && wavelen < low_wavelen {
                    let smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor)
                        / (s.high_freq_factor - s.low_freq_factor);
                    period / ((1.0 - smooth) / s.factor + smooth)
                } else {
                    period
                };
                1.0 / period
            })
            .collect();
        Rope {
            dims,
            inv_freq,
            interleaved: false,
            scale: 1.0,
        }
    }

    pub fn forward(&self, b: &mut GraphBuilder, x: NodeId, positions: NodeId) -> Result<NodeId> {
        let table = HostTensor::from_f32(DType::F32, &[self.inv_freq.len()], &self.inv_freq)?;
        let table = b.constant(table);
        Ok(b.rope(x, positions, table, self.dims, self.interleaved, self.scale)?)
    }
}
