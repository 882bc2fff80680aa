//! GGUF files (llama.cpp's format, v2 and v3, little-endian): header, metadata and tensor table
//! parsed from a memory map with every count, length and offset checked, since a header may
//! claim anything; tensors decode to f32/f16/bf16, or map losslessly onto MLX's affine layout
//! where the ggml type allows it (see [`GgufFile::to_mlx_affine`]).
//!
//! Layout: `"GGUF"`, u32 version, u64 tensor count, u64 metadata count, the metadata
//! (key string, u32 value type, value), the tensor infos (name string, u32 n_dims, u64 dims
//! innermost first, u32 ggml type, u64 offset into the data section), padding to
//! `general.alignment` (default 32), the data section. Strings are a u64 length and bytes.

mod affine;
mod meta;
mod types;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, bail, ensure, Context, Result};
use mlxcel_core::tensor::Storage;
use mlxcel_core::{DType, HostTensor};

pub use affine::{affine_bits, MlxAffine, AFFINE_GROUP_SIZE};
pub use meta::{MetaType, MetaValue, MAX_ARRAY_DEPTH};
pub use types::GgmlType;

pub const MAGIC: [u8; 4] = *b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: usize = 4;

/// The fewest bytes a metadata entry (key length, value type, a one-byte value) and a tensor
/// info (name length, n_dims, type, offset) can take; counts are checked against these.
const MIN_KV_BYTES: usize = 8 + 4 + 1;
const MIN_TENSOR_INFO_BYTES: usize = 8 + 4 + 4 + 8;

#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    /// Row-major, outermost first: GGUF's `ne` reversed, so the last entry is the row length.
    pub shape: Vec<usize>,
    /// Offset into the data section, as stored.
    pub offset: u64,
    pub n_bytes: usize,
    /// Offset into the file (checked: `start + n_bytes` is within it).
    start: usize,
}

impl TensorInfo {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Elements per row (GGUF's `ne[0]`); a whole number of blocks.
    pub fn row_len(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }
}

/// A parsed GGUF file; tensor data stays in the mapped (or given) bytes until asked for.
pub struct GgufFile {
    /// The file's path, or `<memory>`; every error names it.
    pub source: String,
    pub version: u32,
    pub alignment: usize,
    pub metadata: BTreeMap<String, MetaValue>,
    /// File offset of the data section.
    pub data_start: usize,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    data: Storage,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("source", &self.source)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// A cursor over header bytes; every read is bounds-checked and says what it was reading.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pub(crate) pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    pub(crate) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            bail!(
                "truncated: {what} at byte {} needs {n} bytes, but the file ends at byte {}",
                self.pos,
                self.bytes.len()
            );
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    pub(crate) fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        Ok(self.take(N, what)?.try_into().expect("took N bytes"))
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A u64 length and that many bytes. Decoded lossily: GGUF strings are meant to be UTF-8,
    /// but tokenizer vocabularies in the wild hold byte tokens that are not.
    pub(crate) fn string(&mut self, what: &str) -> Result<String> {
        let at = self.pos;
        let len = self.u64(what)?;
        if len > self.remaining() as u64 {
            bail!(
                "truncated: {what} at byte {at} claims {len} bytes, but only {} remain",
                self.remaining()
            );
        }
        Ok(String::from_utf8_lossy(self.take(len as usize, what)?).into_owned())
    }
}

struct Header {
    version: u32,
    alignment: usize,
    metadata: BTreeMap<String, MetaValue>,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    data_start: usize,
}

fn parse_header(bytes: &[u8]) -> Result<Header> {
    let mut r = Reader { bytes, pos: 0 };
    let magic = r.array::<4>("the magic")?;
    ensure!(
        magic == MAGIC,
        "bad magic {magic:02x?} (expected \"GGUF\"): not a GGUF file"
    );
    let version = r.u32("the version")?;
    match version {
        2 | 3 => {}
        1 => bail!("GGUF version 1 (32-bit counts) is not supported; convert the file to v3"),
        v if matches!(v.swap_bytes(), 2 | 3) => bail!("big-endian GGUF files are not supported"),
        v => bail!("unsupported GGUF version {v} (mlxcel reads 2 and 3)"),
    }
    let n_tensors = r.u64("the tensor count")?;
    let n_kv = r.u64("the metadata count")?;

    let n_kv = meta::check_count(&r, n_kv, MIN_KV_BYTES, &|| "the metadata count".into())?;
    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        let key = r
            .string("a metadata key")
            .with_context(|| format!("metadata entry {i}"))?;
        let value = meta::read_type(&mut r)
            .and_then(|ty| meta::read_value(&mut r, ty, 0))
            .with_context(|| format!("metadata key {key:?}"))?;
        ensure!(!metadata.contains_key(&key), "metadata key {key:?} appears twice");
        metadata.insert(key, value);
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => v
            .as_u64()
            .with_context(|| format!("general.alignment is {}, not an unsigned integer", v.a_type_name()))?,
    };
    ensure!(
        alignment.is_power_of_two(),
        "general.alignment is {alignment}, not a power of two"
    );
    let alignment = usize::try_from(alignment).map_err(|_| anyhow!("general.alignment {alignment} is too large"))?;

    let n_tensors = meta::check_count(&r, n_tensors, MIN_TENSOR_INFO_BYTES, &|| "the tensor count".into())?;
    let mut tensors = Vec::with_capacity(n_tensors);
    let mut by_name = HashMap::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let info = read_tensor_info(&mut r).with_context(|| format!("tensor info {i}"))?;
        ensure!(
            by_name.insert(info.name.clone(), i).is_none(),
            "tensor {:?} appears twice",
            info.name
        );
        tensors.push(info);
    }

    let data_start = r
        .pos
        .checked_next_multiple_of(alignment)
        .context("the data section start overflows")?;
    for t in &mut tensors {
        ensure!(
            t.offset.is_multiple_of(alignment as u64),
            "tensor {:?}: data offset {} is not a multiple of the alignment {alignment}",
            t.name,
            t.offset
        );
        let start = usize::try_from(t.offset).ok().and_then(|o| data_start.checked_add(o));
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(start), Some(end)) if end <= bytes.len() => t.start = start,
            _ => bail!(
                "tensor {:?}: its {} bytes at data offset {} (the data section starts at byte {data_start}) \
                 run past the end of the file ({} bytes)",
                t.name,
                t.n_bytes,
                t.offset,
                bytes.len()
            ),
        }
    }
    Ok(Header {
        version,
        alignment,
        metadata,
        tensors,
        by_name,
        data_start,
    })
}

fn read_tensor_info(r: &mut Reader) -> Result<TensorInfo> {
    let name = r.string("a tensor name")?;
    let fail = |e: anyhow::Error| e.context(format!("tensor {name:?}"));
    let n_dims = r.u32("the number of dimensions").map_err(fail)?;
    ensure!(
        n_dims as usize <= MAX_DIMS,
        "tensor {name:?} has {n_dims} dimensions (at most {MAX_DIMS})"
    );
    let mut shape = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        let d = r.u64("a dimension").map_err(fail)?;
        ensure!(
            d <= i64::MAX as u64,
            "tensor {name:?} has dimension {d}, more than ggml's int64 allows"
        );
        shape.push(usize::try_from(d).map_err(|_| anyhow!("tensor {name:?}: dimension {d} does not fit in memory"))?);
    }
    shape.reverse();
    let id = r.u32("the tensor type").map_err(fail)?;
    let ty = GgmlType::from_id(id)
        .with_context(|| format!("unsupported GGUF tensor type {id} for tensor {name:?} (unknown type id)"))?;
    let offset = r.u64("the data offset").map_err(fail)?;

    let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    let numel = numel.with_context(|| format!("tensor {name:?}: element count of {shape:?} overflows"))?;
    let row = shape.last().copied().unwrap_or(1);
    ensure!(
        row.is_multiple_of(ty.block_size()),
        "tensor {name:?}: row length {row} is not a multiple of {ty}'s block size {}",
        ty.block_size()
    );
    let n_bytes = (numel / ty.block_size())
        .checked_mul(ty.block_bytes())
        .with_context(|| format!("tensor {name:?}: byte size of {ty} {shape:?} overflows"))?;
    Ok(TensorInfo {
        name,
        ty,
        shape,
        offset,
        n_bytes,
        start: 0,
    })
}

impl GgufFile {
    /// Memory-maps and parses the file at `path`.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        // SAFETY: the map is read-only; mlxcel never writes model files, and a file changed
        // underneath a running process is outside what any mmap-based loader can guard against.
        let map = unsafe { memmap2::Mmap::map(&file) }.with_context(|| format!("mapping {}", path.display()))?;
        GgufFile::from_storage(Storage::new(Arc::new(map)), &path.display().to_string())
    }

    /// Parses a file held in memory (a copy is kept for the tensor data).
    pub fn parse(bytes: &[u8]) -> Result<GgufFile> {
        GgufFile::from_storage(Storage::from_vec(bytes.to_vec()), "<memory>")
    }

    /// Parses the file in `data`; `source` names it in errors.
    pub fn from_storage(data: Storage, source: &str) -> Result<GgufFile> {
        let h = parse_header(data.bytes()).map_err(|e| anyhow!("{source}: invalid GGUF file: {e:#}"))?;
        Ok(GgufFile {
            source: source.to_string(),
            version: h.version,
            alignment: h.alignment,
            metadata: h.metadata,
            data_start: h.data_start,
            tensors: h.tensors,
            by_name: h.by_name,
            data,
        })
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    fn typed<'a, T>(&'a self, key: &str, want: &str, f: impl Fn(&'a MetaValue) -> Option<T>) -> Result<T> {
        let v = self
            .get(key)
            .with_context(|| format!("{}: metadata key {key:?} is missing", self.source))?;
        f(v).with_context(|| {
            format!(
                "{}: metadata key {key:?} is {}, expected {want}",
                self.source,
                v.a_type_name()
            )
        })
    }

    pub fn get_str(&self, key: &str) -> Result<&str> {
        self.typed(key, "a string", MetaValue::as_str)
    }

    /// Any non-negative integer value.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.typed(key, "a non-negative integer", MetaValue::as_u64)
    }

    /// A float32 (or float64, rounded) value.
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        self.typed(key, "a float", MetaValue::as_f32)
    }

    pub fn get_bool(&self, key: &str) -> Result<bool> {
        self.typed(key, "a bool", MetaValue::as_bool)
    }

    pub fn get_array(&self, key: &str) -> Result<&[MetaValue]> {
        self.typed(key, "an array", MetaValue::as_array)
    }

    /// Tensor names in file order.
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.tensors.iter().map(|t| t.name.as_str())
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    pub fn tensor_info(&self, name: &str) -> Result<&TensorInfo> {
        let i = self
            .by_name
            .get(name)
            .with_context(|| format!("{}: no tensor {name:?}", self.source))?;
        Ok(&self.tensors[*i])
    }

    /// The tensor's stored bytes (whole ggml blocks).
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8]> {
        let t = self.tensor_info(name)?;
        Ok(&self.data.bytes()[t.start..t.start + t.n_bytes])
    }

    /// The tensor's values as f32, row-major in [`TensorInfo::shape`].
    pub fn dequantize(&self, name: &str) -> Result<Vec<f32>> {
        let t = self.tensor_info(name)?;
        let mut out = Vec::with_capacity(t.numel());
        types::dequantize(t.ty, self.tensor_bytes(name)?, &mut out).with_context(|| self.unsupported(t))?;
        Ok(out)
    }

    /// The tensor as a `dtype` (f32, f16 or bf16) host tensor: a view of the file when it is
    /// stored as `dtype`, otherwise dequantized (exact into f32, rounded to nearest otherwise).
    pub fn dequantize_as(&self, name: &str, dtype: DType) -> Result<HostTensor> {
        let t = self.tensor_info(name)?;
        ensure!(
            matches!(dtype, DType::F32 | DType::F16 | DType::BF16),
            "{}: tensor {name:?} can be read as float32, float16 or bfloat16, not {}",
            self.source,
            dtype.name()
        );
        let stored = match t.ty {
            GgmlType::F32 => Some(DType::F32),
            GgmlType::F16 => Some(DType::F16),
            GgmlType::BF16 => Some(DType::BF16),
            _ => None,
        };
        if stored == Some(dtype) {
            return Ok(HostTensor::from_bytes(
                dtype,
                t.shape.clone(),
                self.data.slice(t.start, t.n_bytes)?,
            )?);
        }
        Ok(HostTensor::from_f32(dtype, &t.shape, &self.dequantize(name)?)?)
    }

    fn unsupported(&self, t: &TensorInfo) -> String {
        format!(
            "{}: unsupported GGUF tensor type {} for tensor {:?}",
            self.source, t.ty, t.name
        )
    }
}
