//! Aligned byte buffers and typed views of them.

use std::cell::RefCell;

use half::{bf16, f16};
use mlxcel_core::{DType, Error, Result};

/// Heap bytes aligned to 8, so any of our element types can be viewed in place.
#[derive(Default)]
pub struct AlignedBuf {
    words: Vec<u64>,
    len: usize,
}

impl AlignedBuf {
    pub fn zeroed(len: usize) -> AlignedBuf {
        AlignedBuf {
            words: vec![0; len.div_ceil(8)],
            len,
        }
    }

    pub fn from_bytes(bytes: &[u8]) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(bytes.len());
        b.bytes_mut().copy_from_slice(bytes);
        b
    }

    pub fn capacity(&self) -> usize {
        self.len
    }

    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }
}

/// A read-only typed view. `Bool` data is viewed as `U8`.
#[derive(Clone, Copy)]
pub enum In<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
    I32(&'a [i32]),
    U32(&'a [u32]),
    U8(&'a [u8]),
}

pub enum Out<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [f16]),
    BF16(&'a mut [bf16]),
    I32(&'a mut [i32]),
    U32(&'a mut [u32]),
    U8(&'a mut [u8]),
}

/// Views `bytes` (aligned for `dtype`) as elements of `dtype`.
pub fn view(bytes: &[u8], dtype: DType) -> In<'_> {
    match dtype {
        DType::F32 => In::F32(bytemuck::cast_slice(bytes)),
        DType::F16 => In::F16(bytemuck::cast_slice(bytes)),
        DType::BF16 => In::BF16(bytemuck::cast_slice(bytes)),
        DType::I32 => In::I32(bytemuck::cast_slice(bytes)),
        DType::U32 => In::U32(bytemuck::cast_slice(bytes)),
        DType::U8 | DType::Bool => In::U8(bytes),
    }
}

pub fn view_mut(bytes: &mut [u8], dtype: DType) -> Out<'_> {
    match dtype {
        DType::F32 => Out::F32(bytemuck::cast_slice_mut(bytes)),
        DType::F16 => Out::F16(bytemuck::cast_slice_mut(bytes)),
        DType::BF16 => Out::BF16(bytemuck::cast_slice_mut(bytes)),
        DType::I32 => Out::I32(bytemuck::cast_slice_mut(bytes)),
        DType::U32 => Out::U32(bytemuck::cast_slice_mut(bytes)),
        DType::U8 | DType::Bool => Out::U8(bytes),
    }
}

/// Float storage types: kernels compute in f32 and convert at load and store.
pub trait Float: Copy + Send + Sync + 'static {
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
    /// Widens a run of elements (f16 uses the CPU's conversion instructions when present).
    fn widen(src: &[Self], dst: &mut [f32]) {
        dst.iter_mut().zip(src).for_each(|(d, s)| *d = s.to_f32());
    }
}

impl Float for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl Float for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn widen(src: &[Self], dst: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        src.convert_to_f32_slice(dst);
    }
}

impl Float for bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

/// Integer storage types: kernels compute in i64 and wrap on store.
pub trait Int: Copy + Send + Sync + 'static {
    fn to_i64(self) -> i64;
    fn from_i64(v: i64) -> Self;
}

macro_rules! int_impl {
    ($($t:ty),*) => {$(
        impl Int for $t {
            #[inline(always)]
            fn to_i64(self) -> i64 { self as i64 }
            #[inline(always)]
            fn from_i64(v: i64) -> Self { v as $t }
        }
    )*};
}
int_impl!(i32, u32, u8);

impl<'a> In<'a> {
    pub fn len(&self) -> usize {
        match self {
            In::F32(s) => s.len(),
            In::F16(s) => s.len(),
            In::BF16(s) => s.len(),
            In::I32(s) => s.len(),
            In::U32(s) => s.len(),
            In::U8(s) => s.len(),
        }
    }

    /// Element `i` as f64 (exact for every dtype).
    #[inline]
    pub fn get_f64(&self, i: usize) -> f64 {
        match self {
            In::F32(s) => s[i] as f64,
            In::F16(s) => s[i].to_f64(),
            In::BF16(s) => s[i].to_f64(),
            In::I32(s) => s[i] as f64,
            In::U32(s) => s[i] as f64,
            In::U8(s) => s[i] as f64,
        }
    }

    /// Integer elements (ids, positions, lengths) as i64.
    pub fn get_index(&self, i: usize) -> Result<i64> {
        match self {
            In::I32(s) => Ok(s[i] as i64),
            In::U32(s) => Ok(s[i] as i64),
            In::U8(s) => Ok(s[i] as i64),
            _ => Err(Error::Runtime("expected an integer tensor".into())),
        }
    }

    /// Copies `dst.len()` elements from `start` into `dst` as f32.
    pub fn load_f32(&self, start: usize, dst: &mut [f32]) {
        let n = dst.len();
        match self {
            In::F32(s) => dst.copy_from_slice(&s[start..start + n]),
            In::F16(s) => dst
                .iter_mut()
                .zip(&s[start..start + n])
                .for_each(|(d, v)| *d = v.to_f32()),
            In::BF16(s) => dst
                .iter_mut()
                .zip(&s[start..start + n])
                .for_each(|(d, v)| *d = v.to_f32()),
            _ => {
                for (k, d) in dst.iter_mut().enumerate() {
                    *d = self.get_f64(start + k) as f32;
                }
            }
        }
    }
}

impl Out<'_> {
    /// Stores f32 values at `start`, rounding to the storage dtype (floats only).
    pub fn store_f32(&mut self, start: usize, src: &[f32]) {
        let n = src.len();
        match self {
            Out::F32(d) => d[start..start + n].copy_from_slice(src),
            Out::F16(d) => d[start..start + n]
                .iter_mut()
                .zip(src)
                .for_each(|(d, &v)| *d = f16::from_f32(v)),
            Out::BF16(d) => d[start..start + n]
                .iter_mut()
                .zip(src)
                .for_each(|(d, &v)| *d = bf16::from_f32(v)),
            _ => unreachable!("store_f32 on an integer output"),
        }
    }
}

thread_local! {
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with a zeroed per-thread f32 scratch of `n` elements. The buffer is kept between
/// calls, so steady-state runs do not allocate.
pub fn with_scratch<R>(n: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            if buf.len() < n {
                buf.resize(n, 0.0);
            }
            let s = &mut buf[..n];
            s.fill(0.0);
            f(s)
        }
        // Re-entered on this thread (a kernel nested inside another): use a fresh buffer.
        Err(_) => f(&mut vec![0.0; n]),
    })
}
