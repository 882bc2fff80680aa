//! `MLXCEL_TRACE_DTYPE=1`: what the decode step graph holds (nodes, AsType nodes by source),
//! and `MLXCEL_EXPORT_DECODE_DOT=FILE` / `--dump-graph FILE`: the graph itself as DOT.
//! Statistics are computed once per graph the engine builds, never per token.

use std::path::PathBuf;

use anyhow::{Context, Result};
use mlxcel_core::stats::{self, GraphStats};
use mlxcel_core::Graph;
use mlxcel_engine::Engine;

use crate::cli::Global;

pub fn enabled() -> bool {
    std::env::var("MLXCEL_TRACE_DTYPE").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Where to write the decode graph: `--dump-graph`, else `MLXCEL_EXPORT_DECODE_DOT`.
pub fn dot_path(global: &Global) -> Option<PathBuf> {
    global.dump_graph.clone().or_else(|| {
        std::env::var_os("MLXCEL_EXPORT_DECODE_DOT")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
}

/// Fails at once where the decode graph could not be written (a folder, or a missing parent),
/// rather than after the run that makes it.
pub fn check_dot_path(global: &Global) -> Result<()> {
    let Some(path) = dot_path(global) else {
        return Ok(());
    };
    anyhow::ensure!(!path.is_dir(), "the decode graph's path {} is a folder", path.display());
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some(p) = parent.filter(|p| !p.is_dir()) {
        anyhow::bail!("the decode graph's folder {} does not exist", p.display());
    }
    Ok(())
}

pub fn configure(engine: &mut Engine, global: &Global) {
    engine.set_trace(enabled());
    engine.set_export_dot(dot_path(global));
}

pub fn write_dot(graph: &Graph, global: &Global) -> Result<()> {
    if let Some(path) = dot_path(global) {
        std::fs::write(&path, stats::to_dot(graph))
            .with_context(|| format!("writing the decode graph to {}", path.display()))?;
    }
    Ok(())
}

/// One graph's counts and AsType breakdown, on stderr.
pub fn print_graph(what: &str, s: &GraphStats) {
    eprintln!("mlxcel: trace: {what}: {} AsType of {} nodes", s.astype.len(), s.nodes);
    for g in s.astype_breakdown() {
        eprintln!("mlxcel: trace:   {g}");
    }
}

/// The end-of-run line.
pub fn summary(astype: usize, nodes: usize, policy: &str, backend: &str) -> String {
    format!(
        "mlxcel: decode graph: {astype} AsType of {nodes} nodes per step (dtype policy {policy}, backend {backend})"
    )
}

/// After a run: every step graph the engine built and the summary line, when tracing. With no
/// decode step run (perplexity), the decode graph is built on the side and reported.
pub fn report(engine: &Engine) -> Result<Option<(usize, usize)>> {
    let counts = match engine.decode_counts() {
        Some(c) => Some(c),
        None if enabled() => {
            let g = engine.decode_graph(&Default::default())?;
            let s = stats::stats(&g);
            print_graph("decode step (built, not run)", &s);
            Some((s.astype.len(), s.nodes))
        }
        None => None,
    };
    if !enabled() {
        return Ok(counts);
    }
    let d = engine.graph_dtype();
    for g in engine.step_graphs() {
        let what = format!(
            "{} graph, {} token(s), cache {}, {} activations, ran {}×",
            g.kind, g.tokens, g.capacity, d.activations, g.runs
        );
        print_graph(&what, &g.stats);
    }
    if let Some((astype, nodes)) = counts {
        eprintln!("{}", summary(astype, nodes, d.policy, engine.backend_name()));
    }
    Ok(counts)
}

/// The `--json` fields: `astype_per_step`, `nodes_per_step` and `dtype_policy`.
pub fn json_fields(engine: &Engine, counts: Option<(usize, usize)>) -> serde_json::Value {
    let d = engine.graph_dtype();
    serde_json::json!({
        "astype_per_step": counts.map(|c| c.0),
        "nodes_per_step": counts.map(|c| c.1),
        "dtype_policy": d.policy,
        "activation_dtype": d.activations.short(),
    })
}

/// `obj` with `extra`'s fields added.
pub fn merge(mut obj: serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
    if let (Some(o), serde_json::Value::Object(e)) = (obj.as_object_mut(), extra) {
        o.extend(e);
    }
    obj
}
