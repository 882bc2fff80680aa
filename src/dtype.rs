//! `--dtype`: the policy comes from the flag, else `MLXCEL_DTYPE`, else the `dtype` key of an
//! `mlxcel.toml` in the model folder (beside a `.gguf` file), else `auto`. A bad value in any
//! of them is an error that names where it came from.

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use mlxcel_models::DTypePolicy;

pub const ENV: &str = "MLXCEL_DTYPE";
pub const FILE: &str = "mlxcel.toml";

/// Where a policy came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Flag,
    Env,
    File(PathBuf),
    Default,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Flag => f.write_str("--dtype"),
            Source::Env => f.write_str(ENV),
            Source::File(p) => write!(f, "the dtype key of {}", p.display()),
            Source::Default => f.write_str("the default"),
        }
    }
}

fn parse(value: &str, source: &Source) -> Result<DTypePolicy> {
    DTypePolicy::parse(value)
        .with_context(|| format!("{source}: dtype {value:?} is not one of {}", DTypePolicy::EXPECTED))
}

/// The policy from the three sources, highest first. Every given value is checked, so a bad
/// `MLXCEL_DTYPE` or file is reported even when the flag overrides it.
pub fn choose(flag: Option<&str>, env: Option<&str>, file: Option<(PathBuf, String)>) -> Result<(DTypePolicy, Source)> {
    let mut chosen = None;
    let file = file.map(|(p, v)| (v, Source::File(p)));
    let given = [
        flag.map(|v| (v.to_string(), Source::Flag)),
        env.map(|v| (v.to_string(), Source::Env)),
        file,
    ];
    for (value, source) in given.into_iter().flatten() {
        let policy = parse(&value, &source)?;
        chosen.get_or_insert((policy, source));
    }
    Ok(chosen.unwrap_or((DTypePolicy::Auto, Source::Default)))
}

/// The `dtype` value of `mlxcel.toml` for the model at `model` (a folder or a `.gguf` file),
/// if the file exists and has the key.
pub fn file_value(model: &Path) -> Result<Option<(PathBuf, String)>> {
    let dir = if model.is_dir() {
        model
    } else {
        model.parent().unwrap_or(Path::new("."))
    };
    let path = dir.join(FILE);
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| anyhow::anyhow!("{} is not valid TOML: {}", path.display(), e.message()))?;
    match table.get("dtype") {
        None => Ok(None),
        Some(toml::Value::String(s)) => Ok(Some((path, s.clone()))),
        Some(other) => bail!(
            "{}: dtype must be a string ({}), found {other}",
            path.display(),
            DTypePolicy::EXPECTED
        ),
    }
}

/// The policy for a run on `model` (None: a random-weight preset, no file).
pub fn resolve(flag: Option<&str>, model: Option<&Path>) -> Result<(DTypePolicy, Source)> {
    let env = match std::env::var(ENV) {
        Ok(v) if v.trim().is_empty() => None,
        Ok(v) => Some(v),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(_)) => bail!("{ENV} is not valid UTF-8"),
    };
    let file = match model {
        Some(m) => file_value(m)?,
        None => None,
    };
    choose(flag, env.as_deref(), file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(v: &str) -> Option<(PathBuf, String)> {
        Some((PathBuf::from("m/mlxcel.toml"), v.to_string()))
    }

    #[test]
    fn flag_beats_env_beats_file_beats_default() {
        use DTypePolicy::*;
        assert_eq!(choose(None, None, None).unwrap(), (Auto, Source::Default));
        assert_eq!(
            choose(None, None, file("bf16")).unwrap(),
            (BF16, Source::File("m/mlxcel.toml".into()))
        );
        assert_eq!(choose(None, Some("f16"), file("bf16")).unwrap(), (F16, Source::Env));
        assert_eq!(
            choose(Some("native"), Some("f16"), file("bf16")).unwrap(),
            (Native, Source::Flag)
        );
        assert_eq!(choose(Some("float32"), None, None).unwrap(), (F32, Source::Flag));
    }

    #[test]
    fn a_bad_value_names_its_source_even_when_overridden() {
        let e = choose(Some("f8"), None, None).unwrap_err().to_string();
        assert!(
            e.starts_with("--dtype: dtype \"f8\"") && e.contains("auto, native"),
            "{e}"
        );
        let e = choose(Some("f16"), Some("half"), None).unwrap_err().to_string();
        assert!(e.starts_with("MLXCEL_DTYPE: dtype \"half\""), "{e}");
        let e = choose(Some("f16"), None, file("int4")).unwrap_err().to_string();
        assert!(e.contains("m/mlxcel.toml") && e.contains("\"int4\""), "{e}");
    }

    #[test]
    fn the_file_is_read_beside_a_folder_or_a_gguf_file() {
        let dir = std::env::temp_dir().join(format!("mlxcel-dtype-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(file_value(&dir).unwrap(), None, "no file");
        std::fs::write(dir.join(FILE), "# policy\ndtype = \"bf16\"\nother = 1\n").unwrap();
        let want = Some((dir.join(FILE), "bf16".to_string()));
        assert_eq!(file_value(&dir).unwrap(), want);
        assert_eq!(file_value(&dir.join("model.gguf")).unwrap(), want);
        std::fs::write(dir.join(FILE), "dtype = 16\n").unwrap();
        let e = file_value(&dir).unwrap_err().to_string();
        assert!(e.contains("dtype must be a string"), "{e}");
        std::fs::write(dir.join(FILE), "dtype = \n").unwrap();
        let e = file_value(&dir).unwrap_err().to_string();
        assert!(e.contains("is not valid TOML"), "{e}");
        std::fs::write(dir.join(FILE), "other = 1\n").unwrap();
        assert_eq!(file_value(&dir).unwrap(), None, "no dtype key");
        std::fs::remove_dir_all(&dir).ok();
    }
}
