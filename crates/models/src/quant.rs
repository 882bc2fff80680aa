//! The `quantization` block mlx-lm writes into config.json: defaults plus per-module overrides
//! (`"model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8}`, or `false` for a module
//! left unquantized).

use std::collections::HashMap;

use anyhow::{bail, Context, Result};
use serde_json::Value;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantParams {
    pub bits: u32,
    pub group_size: usize,
}

#[derive(Clone, Debug, Default)]
pub struct QuantConfig {
    pub default: Option<QuantParams>,
    overrides: HashMap<String, Option<QuantParams>>,
}

fn params(v: &Value, what: &str) -> Result<QuantParams> {
    let bits = v["bits"]
        .as_u64()
        .with_context(|| format!("quantization {what}: \"bits\" is missing or not an integer"))?;
    let group = v["group_size"]
        .as_u64()
        .with_context(|| format!("quantization {what}: \"group_size\" is missing or not an integer"))?;
    if !matches!(bits, 2 | 4 | 8) {
        bail!("quantization {what}: {bits}-bit weights are not supported (2, 4 or 8)");
    }
    if !matches!(group, 32 | 64 | 128) {
        bail!("quantization {what}: group size {group} is not supported (32, 64 or 128)");
    }
    if let Some(mode) = v.get("mode").and_then(|m| m.as_str()) {
        if mode != "affine" {
            bail!("quantization {what}: mode {mode:?} is not supported (only affine)");
        }
    }
    Ok(QuantParams {
        bits: bits as u32,
        group_size: group as usize,
    })
}

impl QuantConfig {
    /// Reads `quantization` (or `quantization_config`) from a parsed config.json.
    pub fn from_config(config: &Value) -> Result<QuantConfig> {
        let Some(block) = config.get("quantization").or_else(|| config.get("quantization_config")) else {
            return Ok(QuantConfig::default());
        };
        let obj = block
            .as_object()
            .context("config.json: \"quantization\" must be an object")?;
        let mut q = QuantConfig {
            default: Some(params(block, "block")?),
            overrides: HashMap::new(),
        };
        for (key, value) in obj {
            match value {
                Value::Object(_) => {
                    q.overrides.insert(key.clone(), Some(params(value, key)?));
                }
                Value::Bool(false) => {
                    q.overrides.insert(key.clone(), None);
                }
                _ => {} // group_size, bits, mode, and scalar fields
            }
        }
        Ok(q)
    }

    /// Per-module parameters only (no default): what a converter knows module by module.
    pub fn from_modules(modules: impl IntoIterator<Item = (String, QuantParams)>) -> QuantConfig {
        QuantConfig {
            default: None,
            overrides: modules.into_iter().map(|(k, v)| (k, Some(v))).collect(),
        }
    }

    /// The per-module entries, for writing a config.json.
    pub fn modules(&self) -> impl Iterator<Item = (&str, Option<QuantParams>)> {
        self.overrides.iter().map(|(k, v)| (k.as_str(), *v))
    }

    /// Parameters for the module at `path` (e.g. `model.layers.3.self_attn.q_proj`).
    pub fn for_module(&self, path: &str) -> Option<QuantParams> {
        match self.overrides.get(path) {
            Some(p) => *p,
            None => self.default,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_win_over_the_default() {
        let cfg: Value = serde_json::from_str(
            r#"{"quantization": {"group_size": 64, "bits": 4,
                "model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8},
                "lm_head": false}}"#,
        )
        .unwrap();
        let q = QuantConfig::from_config(&cfg).unwrap();
        assert_eq!(
            q.for_module("model.layers.1.mlp.down_proj"),
            Some(QuantParams {
                bits: 4,
                group_size: 64
            })
        );
        assert_eq!(
            q.for_module("model.layers.0.mlp.down_proj"),
            Some(QuantParams {
                bits: 8,
                group_size: 32
            })
        );
        assert_eq!(q.for_module("lm_head"), None);
    }

    #[test]
    fn bad_blocks_are_clear_errors() {
        for (text, needle) in [
            (r#"{"quantization": {"group_size": 64, "bits": 3}}"#, "3-bit"),
            (r#"{"quantization": {"group_size": 48, "bits": 4}}"#, "group size 48"),
            (r#"{"quantization": {"bits": 4}}"#, "group_size"),
            (r#"{"quantization": 4}"#, "must be an object"),
            (
                r#"{"quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4"}}"#,
                "mxfp4",
            ),
        ] {
            let e = QuantConfig::from_config(&serde_json::from_str(text).unwrap())
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }
}
