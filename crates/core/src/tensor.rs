//! Host tensors: a dtype, a shape and shared, immutable bytes (owned or memory-mapped).

use std::fmt;
use std::sync::Arc;

use half::{bf16, f16};

use crate::dtype::DType;
use crate::error::{Error, Result};

/// Bytes behind a tensor. Anything that can lend a byte slice: a `Vec<u8>`, a memory map, a
/// region of a larger file (see [`Storage::slice`]).
#[derive(Clone)]
pub struct Storage {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    start: usize,
    len: usize,
}

impl Storage {
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>) -> Storage {
        let len = (*owner).as_ref().len();
        Storage { owner, start: 0, len }
    }

    pub fn from_vec(bytes: Vec<u8>) -> Storage {
        Storage::new(Arc::new(bytes))
    }

    /// A sub-range of these bytes, sharing the owner.
    pub fn slice(&self, start: usize, len: usize) -> Result<Storage> {
        if start.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(Error::Invalid(format!(
                "byte range {start}..{start}+{len} is outside a buffer of {} bytes",
                self.len
            )));
        }
        Ok(Storage {
            owner: self.owner.clone(),
            start: self.start + start,
            len,
        })
    }

    pub fn bytes(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.start..self.start + self.len]
    }

    /// True when both share one allocation and range (used to deduplicate uploads).
    pub fn same_as(&self, other: &Storage) -> bool {
        Arc::ptr_eq(&self.owner, &other.owner) && self.start == other.start && self.len == other.len
    }
}

/// A tensor in host memory, row-major and contiguous.
#[derive(Clone)]
pub struct HostTensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: Storage,
}

impl fmt::Debug for HostTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostTensor({} {:?})", self.dtype, self.shape)
    }
}

pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Element types that can be viewed from tensor bytes.
pub trait Element: bytemuck::Pod {
    const DTYPE: DType;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
impl Element for f16 {
    const DTYPE: DType = DType::F16;
}
impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
}
impl Element for i32 {
    const DTYPE: DType = DType::I32;
}
impl Element for u32 {
    const DTYPE: DType = DType::U32;
}
/// `u8` covers both `uint8` and `bool` (one byte, 0 or 1).
impl Element for u8 {
    const DTYPE: DType = DType::U8;
}

impl HostTensor {
    pub fn from_bytes(dtype: DType, shape: Vec<usize>, data: Storage) -> Result<HostTensor> {
        let want = numel(&shape) * dtype.size();
        if data.bytes().len() != want {
            return Err(Error::Invalid(format!(
                "tensor {dtype} {shape:?} needs {want} bytes, got {}",
                data.bytes().len()
            )));
        }
        Ok(HostTensor { dtype, shape, data })
    }

    pub fn from_slice<T: Element>(shape: &[usize], values: &[T]) -> Result<HostTensor> {
        let bytes = bytemuck::cast_slice::<T, u8>(values).to_vec();
        HostTensor::from_bytes(T::DTYPE, shape.to_vec(), Storage::from_vec(bytes))
    }

    /// A tensor of `dtype` from f32 values (rounded to nearest for f16/bf16; ints truncate).
    pub fn from_f32(dtype: DType, shape: &[usize], values: &[f32]) -> Result<HostTensor> {
        let bytes = match dtype {
            DType::F32 => bytemuck::cast_slice(values).to_vec(),
            DType::F16 => values.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect(),
            DType::BF16 => values.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect(),
            DType::I32 => values.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect(),
            DType::U32 => values.iter().flat_map(|&v| (v as u32).to_le_bytes()).collect(),
            DType::U8 => values.iter().map(|&v| v as u8).collect(),
            DType::Bool => values.iter().map(|&v| u8::from(v != 0.0)).collect(),
        };
        HostTensor::from_bytes(dtype, shape.to_vec(), Storage::from_vec(bytes))
    }

    pub fn scalar_f32(dtype: DType, value: f32) -> HostTensor {
        HostTensor::from_f32(dtype, &[], &[value]).expect("one value fits a scalar")
    }

    pub fn zeros(dtype: DType, shape: &[usize]) -> HostTensor {
        let bytes = vec![0u8; numel(shape) * dtype.size()];
        HostTensor {
            dtype,
            shape: shape.to_vec(),
            data: Storage::from_vec(bytes),
        }
    }

    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    pub fn bytes(&self) -> &[u8] {
        self.data.bytes()
    }

    /// Every element widened to f64 (exact for all our dtypes).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        let b = self.bytes();
        match self.dtype {
            DType::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect(),
            DType::F16 => b
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            DType::BF16 => b
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f64())
                .collect(),
            DType::I32 => b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect(),
            DType::U32 => b
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect(),
            DType::U8 | DType::Bool => b.iter().map(|&v| v as f64).collect(),
        }
    }

    pub fn to_f32_vec(&self) -> Vec<f32> {
        self.to_f64_vec().into_iter().map(|v| v as f32).collect()
    }

    /// Integer elements as i64 (for ids and indices). Floats are rejected.
    pub fn to_i64_vec(&self) -> Result<Vec<i64>> {
        if self.dtype.is_float() {
            return Err(Error::DType(format!("expected an integer tensor, got {}", self.dtype)));
        }
        Ok(self.to_f64_vec().into_iter().map(|v| v as i64).collect())
    }

    /// A typed copy of the elements; fails when `T` is not this tensor's dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let matches = T::DTYPE == self.dtype || (T::DTYPE == DType::U8 && self.dtype == DType::Bool);
        if !matches {
            return Err(Error::DType(format!(
                "tensor is {}, asked for {}",
                self.dtype,
                T::DTYPE
            )));
        }
        Ok(bytemuck::pod_collect_to_vec(self.bytes()))
    }
}

/// Element conversion with MLX's semantics: floats round to nearest even, floats to integers
/// truncate toward zero (saturating, NaN to 0), anything to bool is `!= 0`. Every backend's
/// `AsType` must agree with this function bit for bit; constant folding uses it directly.
pub fn convert_elements(from: DType, src: &[u8], to: DType, dst: &mut [u8]) {
    let n = src.len() / from.size();
    debug_assert_eq!(dst.len(), n * to.size());
    let read = |i: usize| -> f64 {
        let s = &src[i * from.size()..(i + 1) * from.size()];
        match from {
            DType::F32 => f32::from_le_bytes(s.try_into().unwrap()) as f64,
            DType::F16 => f16::from_le_bytes([s[0], s[1]]).to_f64(),
            DType::BF16 => bf16::from_le_bytes([s[0], s[1]]).to_f64(),
            DType::I32 => i32::from_le_bytes(s.try_into().unwrap()) as f64,
            DType::U32 => u32::from_le_bytes(s.try_into().unwrap()) as f64,
            DType::U8 | DType::Bool => s[0] as f64,
        }
    };
    for i in 0..n {
        let v = read(i);
        let d = &mut dst[i * to.size()..(i + 1) * to.size()];
        match to {
            // Via f32 first: f64 → f16 directly could round differently from the f32 path the
            // kernels take for f32 sources (double rounding is not an issue: f32 → f16 is what
            // the backends do, and every non-f32 source is exact in f32 or an integer).
            DType::F32 => d.copy_from_slice(&(v as f32).to_le_bytes()),
            DType::F16 => d.copy_from_slice(&f16::from_f32(v as f32).to_le_bytes()),
            DType::BF16 => d.copy_from_slice(&bf16::from_f32(v as f32).to_le_bytes()),
            DType::I32 => d.copy_from_slice(&(v as i32).to_le_bytes()),
            DType::U32 => d.copy_from_slice(&(v as u32).to_le_bytes()),
            DType::U8 => d[0] = v as u8,
            DType::Bool => d[0] = u8::from(v != 0.0),
        }
    }
}

impl HostTensor {
    /// This tensor repeated along its axes of length 1 to `shape` (same rank; every other
    /// axis equal), as a broadcast reads it.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<HostTensor> {
        let rank = shape.len();
        if self.shape.len() != rank || self.shape.iter().zip(shape).any(|(&h, &s)| h != s && h != 1) {
            return Err(crate::error::shape_err(
                "broadcast",
                format!("cannot broadcast {:?} to {shape:?}", self.shape),
            ));
        }
        let size = self.dtype.size();
        let mut strides = vec![0; rank];
        let mut step = 1;
        for a in (0..rank).rev() {
            strides[a] = if self.shape[a] == 1 { 0 } else { step };
            step *= self.shape[a];
        }
        let (src, n) = (self.bytes(), numel(shape));
        let mut out = vec![0u8; n * size];
        for (i, dst) in out.chunks_exact_mut(size).enumerate() {
            let (mut rest, mut at) = (i, 0);
            for a in (0..rank).rev() {
                at += (rest % shape[a]) * strides[a];
                rest /= shape[a];
            }
            dst.copy_from_slice(&src[at * size..(at + 1) * size]);
        }
        HostTensor::from_bytes(self.dtype, shape.to_vec(), Storage::from_vec(out))
    }

    /// This tensor converted to `dtype` by [`convert_elements`].
    pub fn convert(&self, dtype: DType) -> HostTensor {
        if dtype == self.dtype {
            return self.clone();
        }
        let mut out = vec![0u8; self.numel() * dtype.size()];
        convert_elements(self.dtype, self.bytes(), dtype, &mut out);
        HostTensor {
            dtype,
            shape: self.shape.clone(),
            data: Storage::from_vec(out),
        }
    }
}
