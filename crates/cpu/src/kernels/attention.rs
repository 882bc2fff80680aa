//! Attention over a KV cache, and the cache write.

use mlxcel_core::{Error, Result};
use rayon::prelude::*;

use crate::buffer::{with_scratch, Float, In, Out};

pub struct Params {
    pub scale: f32,
    pub causal: bool,
    pub window: Option<usize>,
    pub softcap: Option<f32>,
}

impl Params {
    pub fn new(scale: f32, causal: bool, window: Option<usize>, softcap: Option<f32>) -> Params {
        Params {
            scale,
            causal,
            window,
            softcap,
        }
    }
}

/// Largest value head dimension held on the stack per query row.
const MAX_DV: usize = 512;
/// Largest batch (sequences) per attention call.
const MAX_BATCH: usize = 256;

/// Where the keys and values of (batch, kv head, position) live.
enum Layout {
    /// Caches `[B, Hkv, S, D]`.
    Dense { hkv: usize, s: usize },
    /// A pool `[P, Hkv, D]`: row `b`'s position `j` at slot `table[b · width + j / bs] · bs + j % bs`.
    Paged {
        hkv: usize,
        table: Vec<usize>,
        width: usize,
        bs: usize,
    },
}

impl Layout {
    /// The k row (D wide; v: Dv wide) of position `j` of batch `bi`'s kv head `kvh`.
    fn row(&self, bi: usize, kvh: usize, j: usize) -> usize {
        match self {
            Layout::Dense { hkv, s } => (bi * hkv + kvh) * s + j,
            Layout::Paged { hkv, table, width, bs } => (table[bi * width + j / bs] * bs + j % bs) * hkv + kvh,
        }
    }

    /// Positions a row can hold.
    fn capacity(&self) -> usize {
        match self {
            Layout::Dense { s, .. } => *s,
            Layout::Paged { width, bs, .. } => width * bs,
        }
    }

    fn kv_heads(&self) -> usize {
        match self {
            Layout::Dense { hkv, .. } | Layout::Paged { hkv, .. } => *hkv,
        }
    }
}

/// `out [B, Hq, T, Dv]`: each query row attends to the valid keys of its KV head with an
/// online (single pass) softmax in f32.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: In,
    sq: &[usize],
    k: In,
    v: In,
    sk: &[usize],
    dv: usize,
    kv_len: In,
    p: &Params,
    out: Out,
) -> Result<()> {
    let layout = Layout::Dense { hkv: sk[1], s: sk[2] };
    attend(q, sq, k, v, dv, kv_len, &layout, p, out)
}

/// [`attention`] over a paged pool `k [P, Hkv, D]`, `v [P, Hkv, Dv]` through `table [B, M]`
/// (blocks of `block_size` slots).
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    q: In,
    sq: &[usize],
    k: In,
    v: In,
    sk: &[usize],
    dv: usize,
    kv_len: In,
    (table, st): (In, &[usize]),
    block_size: usize,
    p: &Params,
    out: Out,
) -> Result<()> {
    let blocks = sk[0] / block_size;
    let table = (0..table.len())
        .map(|i| {
            let b = table.get_index(i)?;
            if b < 0 || b as usize >= blocks {
                return Err(Error::Runtime(format!(
                    "paged attention: block {b} outside the pool of {blocks}"
                )));
            }
            Ok(b as usize)
        })
        .collect::<Result<Vec<_>>>()?;
    let layout = Layout::Paged {
        hkv: sk[1],
        table,
        width: st[1],
        bs: block_size,
    };
    attend(q, sq, k, v, dv, kv_len, &layout, p, out)
}

#[allow(clippy::too_many_arguments)]
fn attend(
    q: In,
    sq: &[usize],
    k: In,
    v: In,
    dv: usize,
    kv_len: In,
    layout: &Layout,
    p: &Params,
    mut out: Out,
) -> Result<()> {
    let (b, hq, t) = (sq[0], sq[1], sq[2]);
    let s = layout.capacity();
    if dv > MAX_DV {
        return Err(Error::Unsupported {
            backend: "cpu",
            op: format!("attention with value head dim {dv} > {MAX_DV}"),
        });
    }
    let mut lens = [0usize; MAX_BATCH];
    if b > MAX_BATCH {
        return Err(Error::Unsupported {
            backend: "cpu",
            op: format!("attention with batch {b} > {MAX_BATCH}"),
        });
    }
    for (bi, len) in lens.iter_mut().enumerate().take(b) {
        let l = kv_len.get_index(if kv_len.len() == 1 { 0 } else { bi })?;
        if l < t as i64 || l as usize > s {
            return Err(Error::Runtime(format!(
                "kv_len {l} must be within {t}..={s} (query length..capacity)"
            )));
        }
        *len = l as usize;
    }
    // Rows of the output, one per (batch, head, query), computed in parallel into f32.
    let dims = Dims {
        hq,
        t,
        d: sq[3],
        dv,
        group: hq / layout.kv_heads(),
    };
    with_scratch(b * hq * t * dv, |result| {
        match (k, v) {
            (In::F32(k), In::F32(v)) => run(&q, k, v, &lens, &dims, layout, p, result),
            (In::F16(k), In::F16(v)) => run(&q, k, v, &lens, &dims, layout, p, result),
            (In::BF16(k), In::BF16(v)) => run(&q, k, v, &lens, &dims, layout, p, result),
            _ => return Err(super::dtype_mismatch("attention")),
        }
        out.store_f32(0, result);
        Ok(())
    })
}

struct Dims {
    hq: usize,
    t: usize,
    d: usize,
    dv: usize,
    group: usize,
}

#[allow(clippy::too_many_arguments)]
fn run<T: Float>(
    q: &In,
    k: &[T],
    v: &[T],
    lens: &[usize],
    dims: &Dims,
    layout: &Layout,
    p: &Params,
    result: &mut [f32],
) {
    let &Dims { hq, t, d, dv, group } = dims;
    result.par_chunks_mut(dv).enumerate().for_each(|(r, o)| {
        let (bi, hi, ti) = (r / (hq * t), (r / t) % hq, r % t);
        let kvh = hi / group;
        let len = lens[bi];
        let pos = len - t + ti; // absolute position of this query
        let hi_key = if p.causal { pos + 1 } else { len };
        let lo_key = p.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let mut qrow = [0.0f32; MAX_DV];
        let qrow = &mut qrow[..d];
        q.load_f32(r * d, qrow);
        let (mut m, mut l) = (f32::NEG_INFINITY, 0.0f32);
        let mut acc = [0.0f32; MAX_DV];
        let acc = &mut acc[..dv];
        for j in lo_key..hi_key {
            let row = layout.row(bi, kvh, j);
            let kr = &k[row * d..(row + 1) * d];
            let mut score = super::matmul::dot(qrow, kr) * p.scale;
            if let Some(c) = p.softcap {
                score = c * (score / c).tanh();
            }
            let m_new = m.max(score);
            let correction = (m - m_new).exp();
            let w = (score - m_new).exp();
            l = l * correction + w;
            let vr = &v[row * dv..(row + 1) * dv];
            acc.iter_mut()
                .zip(vr)
                .for_each(|(a, x)| *a = *a * correction + w * x.to_f32());
            m = m_new;
        }
        let inv = if l > 0.0 { 1.0 / l } else { 0.0 };
        o.iter_mut().zip(acc.iter()).for_each(|(o, a)| *o = a * inv);
    });
}

/// Copies `new [B, H, T, D]` into `cache [B, H, S, D]` at each batch's position.
pub fn kv_write(cache: &mut [u8], sc: &[usize], new: &[u8], sn: &[usize], pos: In, size: usize) -> Result<()> {
    let (b, h, s, d) = (sc[0], sc[1], sc[2], sc[3]);
    let t = sn[2];
    let row = d * size;
    if t == 0 {
        return Ok(()); // nothing to write (pos may be [B, 0])
    }
    if pos.len() == b * t && t > 1 {
        // A slot a token (pos [B, T]).
        for bi in 0..b {
            for ti in 0..t {
                let p = pos.get_index(bi * t + ti)?;
                if p < 0 || p as usize >= s {
                    return Err(Error::Runtime(format!(
                        "KV cache overflow: writing a token at position {p} into a cache of {s}"
                    )));
                }
                for hi in 0..h {
                    let src = ((bi * h + hi) * t + ti) * row;
                    let dst = ((bi * h + hi) * s + p as usize) * row;
                    cache[dst..dst + row].copy_from_slice(&new[src..src + row]);
                }
            }
        }
        return Ok(());
    }
    for bi in 0..b {
        let p = pos.get_index(if pos.len() == 1 { 0 } else { bi })?;
        if p < 0 || p as usize + t > s {
            return Err(Error::Runtime(format!(
                "KV cache overflow: writing {t} tokens at position {p} into a cache of {s}"
            )));
        }
        let p = p as usize;
        for hi in 0..h {
            let src = ((bi * h + hi) * t) * row;
            let dst = ((bi * h + hi) * s + p) * row;
            cache[dst..dst + t * row].copy_from_slice(&new[src..src + t * row]);
        }
    }
    Ok(())
}
