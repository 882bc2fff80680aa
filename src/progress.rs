//! Progress display for long work (loading weights). Drawn only when stderr is a terminal.

use std::path::Path;

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use mlxcel_models::{DTypePlan, DTypePolicy, Transformer};

/// Models smaller than this load too fast for a bar to help.
const BAR_MIN_BYTES: usize = 256 << 20;

/// Loads the model at `dir` under `policy` for the backend named `backend`.
pub fn load_model(dir: &Path, policy: DTypePolicy, backend: &str) -> Result<(Transformer, DTypePlan)> {
    let mut bar: Option<ProgressBar> = None;
    let model = mlxcel_models::load_for(dir, policy, backend, &mut |done, total| {
        if total < BAR_MIN_BYTES {
            return;
        }
        let b = bar.get_or_insert_with(|| {
            let b = ProgressBar::new(total as u64);
            b.set_style(
                ProgressStyle::with_template("loading weights {bar:40} {bytes}/{total_bytes} ({eta})")
                    .expect("a valid template"),
            );
            b
        });
        b.set_position(done as u64);
    })?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(model)
}
