//! Writes a model folder the way mlx-lm lays one out: `config.json` (with the `quantization`
//! block and per-module overrides), `model.safetensors` (`{"format": "mlx"}` metadata; shards of
//! at most 5 GiB named `model-00001-of-0000N.safetensors` past that, as `mlx_lm.utils.save_model`
//! does) and `model.safetensors.index.json`.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::{Context, Result};
use mlxcel_core::{DType, HostTensor};
use serde_json::{json, Value};

use crate::quant::QuantParams;

/// mlx-lm's `MAX_FILE_SIZE_GB` (5 << 30 bytes) per weight file.
pub const SHARD_BYTES: usize = 5 << 30;

/// Bytes written so far, and the callback that hears about them.
struct Written<'p> {
    done: usize,
    total: usize,
    progress: &'p mut dyn FnMut(usize, usize),
}

/// safetensors asks for a tensor's bytes right before writing them, which is when progress moves.
struct View<'a, 'p> {
    tensor: &'a HostTensor,
    written: &'a RefCell<Written<'p>>,
}

impl safetensors::View for View<'_, '_> {
    fn dtype(&self) -> safetensors::Dtype {
        match self.tensor.dtype {
            DType::F32 => safetensors::Dtype::F32,
            DType::F16 => safetensors::Dtype::F16,
            DType::BF16 => safetensors::Dtype::BF16,
            DType::U32 => safetensors::Dtype::U32,
            DType::I32 => safetensors::Dtype::I32,
            DType::U8 => safetensors::Dtype::U8,
            DType::Bool => safetensors::Dtype::BOOL,
        }
    }
    fn shape(&self) -> &[usize] {
        &self.tensor.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        let mut w = self.written.borrow_mut();
        w.done += self.data_len();
        let (done, total) = (w.done, w.total);
        (w.progress)(done, total);
        Cow::Borrowed(self.tensor.bytes())
    }
    fn data_len(&self) -> usize {
        self.tensor.bytes().len()
    }
}

/// The `quantization` block: the most common parameters as the default, the rest per module,
/// and `false` for each of `dense` (2-D weights left unquantized), so that no mlx-lm version
/// quantizes them on load.
pub fn quantization_block(modules: &HashMap<String, QuantParams>, dense: &[String]) -> Option<Value> {
    let mut counts: BTreeMap<(u32, usize), usize> = BTreeMap::new();
    for q in modules.values() {
        *counts.entry((q.bits, q.group_size)).or_default() += 1;
    }
    let (&(bits, group), _) = counts.iter().max_by_key(|(_, &n)| n)?;
    let mut block = serde_json::Map::new();
    block.insert("group_size".into(), json!(group));
    block.insert("bits".into(), json!(bits));
    block.insert("mode".into(), json!("affine"));
    let mut names: Vec<&String> = modules.keys().collect();
    names.sort();
    for name in names {
        let q = modules[name];
        if (q.bits, q.group_size) != (bits, group) {
            block.insert(
                name.clone(),
                json!({ "group_size": q.group_size, "bits": q.bits, "mode": "affine" }),
            );
        }
    }
    let mut dense: Vec<&String> = dense.iter().filter(|m| !modules.contains_key(*m)).collect();
    dense.sort();
    for name in dense {
        block.insert(name.clone(), json!(false));
    }
    Some(Value::Object(block))
}

/// Modules with a 2-D `X.weight` and no `X.scales`: the dense matrices of a checkpoint.
pub fn dense_modules(tensors: &[(String, HostTensor)]) -> Vec<String> {
    let names: std::collections::HashSet<&str> = tensors.iter().map(|(n, _)| n.as_str()).collect();
    let mut dense: Vec<String> = tensors
        .iter()
        .filter(|(_, t)| t.shape.len() == 2)
        .filter_map(|(n, _)| n.strip_suffix(".weight"))
        .filter(|m| !names.contains(format!("{m}.scales").as_str()))
        .map(str::to_string)
        .collect();
    dense.sort();
    dense
}

/// Writes `config` (plus the quantization block) and `tensors` into `dir`.
pub fn save_folder(
    dir: &Path,
    config: Value,
    tensors: &[(String, HostTensor)],
    modules: &HashMap<String, QuantParams>,
) -> Result<()> {
    save_folder_with_progress(dir, config, tensors, modules, &mut |_, _| {})
}

/// [`save_folder`], calling `progress(bytes written, total)` as tensor data goes out.
pub fn save_folder_with_progress(
    dir: &Path,
    mut config: Value,
    tensors: &[(String, HostTensor)],
    modules: &HashMap<String, QuantParams>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    if let Some(block) = quantization_block(modules, &dense_modules(tensors)) {
        config["quantization"] = block.clone();
        config["quantization_config"] = block;
    }
    let path = dir.join("config.json");
    std::fs::write(&path, serde_json::to_string_pretty(&config)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;

    let mut sorted: Vec<&(String, HostTensor)> = tensors.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    // A tensor larger than a shard gets a shard of its own, as in mlx-lm's make_shards.
    let mut shards: Vec<Vec<&(String, HostTensor)>> = Vec::new();
    let mut shard_size = 0;
    for entry in sorted {
        let n = entry.1.bytes().len();
        if shards.is_empty() || shard_size + n > SHARD_BYTES {
            shards.push(Vec::new());
            shard_size = 0;
        }
        shards.last_mut().expect("a shard was just pushed").push(entry);
        shard_size += n;
    }
    let total: usize = tensors.iter().map(|(_, t)| t.bytes().len()).sum();
    let written = RefCell::new(Written {
        done: 0,
        total,
        progress,
    });
    let mut weight_map = BTreeMap::new();
    let count = shards.len();
    for (i, shard) in shards.into_iter().enumerate() {
        let file = match count {
            1 => "model.safetensors".to_string(),
            _ => format!("model-{:05}-of-{count:05}.safetensors", i + 1),
        };
        for (name, _) in &shard {
            weight_map.insert(name.clone(), file.clone());
        }
        let views = shard.into_iter().map(|(n, t)| {
            let view = View {
                tensor: t,
                written: &written,
            };
            (n.clone(), view)
        });
        let meta = HashMap::from([("format".to_string(), "mlx".to_string())]);
        let path = dir.join(&file);
        safetensors::serialize_to_file(views, Some(meta), &path)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let index = json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
    let path = dir.join("model.safetensors.index.json");
    std::fs::write(&path, serde_json::to_string_pretty(&index)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(bits: u32, group_size: usize) -> QuantParams {
        QuantParams { bits, group_size }
    }

    #[test]
    fn the_most_common_parameters_are_the_default_and_dense_modules_say_false() {
        let modules = HashMap::from([
            ("a".to_string(), params(4, 64)),
            ("b".to_string(), params(4, 64)),
            ("c".to_string(), params(8, 32)),
        ]);
        let block = quantization_block(&modules, &["lm_head".to_string(), "a".to_string()]).unwrap();
        assert_eq!(
            block,
            json!({"group_size": 64, "bits": 4, "mode": "affine",
                   "c": {"group_size": 32, "bits": 8, "mode": "affine"}, "lm_head": false})
        );
        assert_eq!(quantization_block(&HashMap::new(), &["x".to_string()]), None);
    }

    #[test]
    fn dense_modules_are_two_dimensional_weights_without_scales() {
        let t = |shape: &[usize]| HostTensor::zeros(DType::F32, shape);
        let tensors = vec![
            ("q.weight".to_string(), t(&[4, 2])),
            ("q.scales".to_string(), t(&[4, 1])),
            ("lm_head.weight".to_string(), t(&[4, 8])),
            ("norm.weight".to_string(), t(&[8])),
            ("q.bias".to_string(), t(&[4])),
        ];
        assert_eq!(dense_modules(&tensors), vec!["lm_head".to_string()]);
    }
}
