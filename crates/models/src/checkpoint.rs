//! Safetensors checkpoints, single file or sharded, memory-mapped: tensors are views of the
//! mapped files (no copies), looked up by their names in the checkpoint.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{bail, ensure, Context, Result};
use mlxcel_core::tensor::Storage;
use mlxcel_core::{DType, HostTensor};

struct Entry {
    file: usize,
    dtype: DType,
    shape: Vec<usize>,
    start: usize,
    len: usize,
}

pub struct Checkpoint {
    files: Vec<(PathBuf, Storage)>,
    tensors: HashMap<String, Entry>,
    /// Floating tensors are handed out in this dtype (the `--dtype` policies), converted once
    /// as each is read at load; None: as stored.
    float_dtype: Option<DType>,
    /// The names [`Checkpoint::get`] has handed out: what a model loaded from it reads.
    read: Mutex<HashSet<String>>,
}

fn dtype_of(d: safetensors::Dtype, name: &str, path: &Path) -> Result<DType> {
    Ok(match d {
        safetensors::Dtype::F32 => DType::F32,
        safetensors::Dtype::F16 => DType::F16,
        safetensors::Dtype::BF16 => DType::BF16,
        safetensors::Dtype::U32 => DType::U32,
        safetensors::Dtype::I32 => DType::I32,
        safetensors::Dtype::U8 => DType::U8,
        safetensors::Dtype::BOOL => DType::Bool,
        other => bail!(
            "{}: tensor {name} has dtype {other:?}, which mlxcel does not read",
            path.display()
        ),
    })
}

impl Checkpoint {
    /// Opens `model.safetensors`, or the shards listed in `model.safetensors.index.json`, or
    /// every `*.safetensors` file in `dir`.
    pub fn open_dir(dir: &Path) -> Result<Checkpoint> {
        let index = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        let files: Vec<PathBuf> = if index.exists() {
            let text = std::fs::read_to_string(&index).with_context(|| format!("reading {}", index.display()))?;
            let json: serde_json::Value =
                serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", index.display()))?;
            let map = json["weight_map"]
                .as_object()
                .with_context(|| format!("{} has no weight_map object", index.display()))?;
            let mut names: Vec<&str> = map.values().filter_map(|v| v.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            names.into_iter().map(|n| dir.join(n)).collect()
        } else if single.exists() {
            vec![single]
        } else {
            let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
                .with_context(|| format!("reading model folder {}", dir.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect();
            found.sort();
            found
        };
        ensure!(!files.is_empty(), "no .safetensors weights in {}", dir.display());
        Checkpoint::open_files(&files)
    }

    /// A checkpoint of tensors already in memory (converted from another format).
    pub fn from_tensors(tensors: impl IntoIterator<Item = (String, HostTensor)>) -> Checkpoint {
        let mut ck = Checkpoint {
            files: Vec::new(),
            tensors: HashMap::new(),
            float_dtype: None,
            read: Mutex::default(),
        };
        for (name, t) in tensors {
            let len = t.bytes().len();
            let entry = Entry {
                file: ck.files.len(),
                dtype: t.dtype,
                shape: t.shape.clone(),
                start: 0,
                len,
            };
            ck.files.push((
                PathBuf::from(&name),
                t.data.slice(0, len).expect("a tensor's own bytes"),
            ));
            ck.tensors.insert(name, entry);
        }
        ck
    }

    pub fn open_files(paths: &[PathBuf]) -> Result<Checkpoint> {
        let mut ck = Checkpoint {
            files: Vec::new(),
            tensors: HashMap::new(),
            float_dtype: None,
            read: Mutex::default(),
        };
        for path in paths {
            let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
            // SAFETY: the map is read-only; mlxcel never writes checkpoint files, and a file changed
            // underneath a running process is outside what any mmap-based loader can guard against.
            let map = unsafe { memmap2::Mmap::map(&file) }.with_context(|| format!("mapping {}", path.display()))?;
            ck.add_file(Storage::new(Arc::new(map)), path)?;
        }
        Ok(ck)
    }

    /// A checkpoint of one safetensors file held in memory (what the fuzz target feeds).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Checkpoint> {
        let mut ck = Checkpoint {
            files: Vec::new(),
            tensors: HashMap::new(),
            float_dtype: None,
            read: Mutex::default(),
        };
        ck.add_file(Storage::from_vec(bytes), Path::new("<memory>"))?;
        Ok(ck)
    }

    /// Reads one file's header and checks every tensor's byte range against its data section.
    fn add_file(&mut self, storage: Storage, path: &Path) -> Result<()> {
        let bytes = storage.bytes();
        let (header_len, meta) = safetensors::SafeTensors::read_metadata(bytes)
            .map_err(|e| anyhow::anyhow!("{} is not a valid safetensors file: {e}", path.display()))?;
        let data_start = 8 + header_len;
        let data_len = bytes
            .len()
            .checked_sub(data_start)
            .with_context(|| format!("{}: the header runs past the end of the file", path.display()))?;
        let file_index = self.files.len();
        for (name, info) in meta.tensors() {
            let dtype = dtype_of(info.dtype, &name, path)?;
            let (start, end) = info.data_offsets;
            let elems = info.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            let want = elems.and_then(|n| n.checked_mul(dtype.size()));
            ensure!(
                start <= end && end <= data_len && want == Some(end - start),
                "{}: tensor {name} claims bytes {start}..{end} for {dtype} {:?}, but the data section holds {data_len} bytes",
                path.display(),
                info.shape
            );
            ensure!(
                !self.tensors.contains_key(&name),
                "tensor {name} appears in more than one shard"
            );
            let entry = Entry {
                file: file_index,
                dtype,
                shape: info.shape.clone(),
                start: data_start + start,
                len: end - start,
            };
            self.tensors.insert(name, entry);
        }
        self.files.push((path.to_path_buf(), storage));
        Ok(())
    }

    /// Reads every page of the mapped files once, so the first step does not pay for disk
    /// reads; `progress(done, total)` is called as bytes come in.
    pub fn prefetch(&self, progress: &mut dyn FnMut(usize, usize)) {
        const PAGE: usize = 4096;
        const REPORT: usize = 16 << 20;
        let total: usize = self.files.iter().map(|(_, s)| s.bytes().len()).sum();
        let mut done = 0;
        for (_, storage) in &self.files {
            let bytes = storage.bytes();
            for chunk in bytes.chunks(REPORT) {
                let mut sum = 0u8;
                for page in chunk.chunks(PAGE) {
                    sum = sum.wrapping_add(page[0]);
                }
                std::hint::black_box(sum);
                done += chunk.len();
                progress(done, total);
            }
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(|s| s.as_str())
    }

    /// Total bytes of tensor data.
    pub fn total_bytes(&self) -> usize {
        self.tensors.values().map(|e| e.len).sum()
    }

    /// From now on, floating tensors come out of [`Checkpoint::get`] converted to `dtype`
    /// (None: as stored). Integer tensors (packed quantized weights) never change.
    pub fn set_float_dtype(&mut self, dtype: Option<DType>) {
        self.float_dtype = dtype;
    }

    /// The tensor `name`, as stored (or in the float dtype set by `set_float_dtype`).
    pub fn get(&self, name: &str) -> Result<HostTensor> {
        let e = self
            .tensors
            .get(name)
            .with_context(|| format!("checkpoint has no tensor {name}"))?;
        self.read.lock().expect("the read-names set").insert(name.to_string());
        let data = self.files[e.file].1.slice(e.start, e.len)?;
        let t = HostTensor::from_bytes(e.dtype, e.shape.clone(), data)?;
        Ok(match self.float_dtype {
            Some(d) if t.dtype.is_float() && t.dtype != d => t.convert(d),
            _ => t,
        })
    }

    /// The names of the tensors [`Checkpoint::get`] has not handed out, sorted.
    pub fn unread(&self) -> Vec<&str> {
        let read = self.read.lock().expect("the read-names set");
        let mut names: Vec<&str> = self.names().filter(|n| !read.contains(*n)).collect();
        names.sort_unstable();
        names
    }

    /// The tensor `name`, which must have `shape`.
    pub fn get_shaped(&self, name: &str, shape: &[usize]) -> Result<HostTensor> {
        let t = self.get(name)?;
        ensure!(
            t.shape == shape,
            "tensor {name}: expected shape {shape:?}, found {:?}",
            t.shape
        );
        Ok(t)
    }
}
