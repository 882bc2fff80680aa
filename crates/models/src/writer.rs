//! Writes a model folder the way mlx-lm lays one out: `config.json` (with the `quantization`
//! block and per-module overrides) and `model.safetensors` (`{"format": "mlx"}` metadata).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::{Context, Result};
use mlxcel_core::{DType, HostTensor};
use serde_json::{json, Value};

use crate::quant::QuantParams;

struct View<'a>(&'a HostTensor);

impl safetensors::View for View<'_> {
    fn dtype(&self) -> safetensors::Dtype {
        match self.0.dtype {
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
        &self.0.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.0.bytes())
    }
    fn data_len(&self) -> usize {
        self.0.bytes().len()
    }
}

/// The `quantization` block: the most common parameters as the default, the rest per module.
pub fn quantization_block(modules: &HashMap<String, QuantParams>) -> Option<Value> {
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
    Some(Value::Object(block))
}

/// Writes `config` (plus the quantization block) and `tensors` into `dir`.
pub fn save_folder(
    dir: &Path,
    mut config: Value,
    tensors: &[(String, HostTensor)],
    modules: &HashMap<String, QuantParams>,
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    if let Some(block) = quantization_block(modules) {
        config["quantization"] = block.clone();
        config["quantization_config"] = block;
    }
    let path = dir.join("config.json");
    std::fs::write(&path, serde_json::to_string_pretty(&config)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    let mut sorted: Vec<&(String, HostTensor)> = tensors.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let views = sorted.into_iter().map(|(n, t)| (n.clone(), View(t)));
    let meta = HashMap::from([("format".to_string(), "mlx".to_string())]);
    let path = dir.join("model.safetensors");
    safetensors::serialize_to_file(views, Some(meta), &path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
