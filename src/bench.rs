//! `mlxcel bench`: prefill and decode throughput in the manner of llama-bench (`-p` prompt
//! tokens, `-g` generated, `-r` runs after one warm-up run), with the memory traffic of a
//! decode token, the bandwidth that achieves and its share of the backend's measured copy
//! bandwidth. Random-weight presets need no checkpoint: speed depends on the shapes and
//! layout of the weights, not on their values.

use anyhow::{bail, ensure, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use mlxcel_core::rng::SplitMix64;
use mlxcel_core::stats;
use mlxcel_engine::engine::decode_graph;
use mlxcel_engine::{Engine, GenerateOptions, GraphDType, SamplerSettings};
use mlxcel_models::synth::SynthOptions;
use mlxcel_models::{DTypePlan, DTypePolicy, Transformer};
use serde_json::json;

use crate::cli::{BenchArgs, Device, Global, DEFAULT_BLOCK_SIZE};
use crate::traffic::decode_traffic;

/// Mean and sample standard deviation (0 for one value).
fn mean_std(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    if v.len() < 2 {
        return (mean, 0.0);
    }
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn bar(len: u64, template: &str, hidden: bool) -> ProgressBar {
    if hidden {
        return ProgressBar::hidden();
    }
    let b = ProgressBar::new(len);
    b.set_style(ProgressStyle::with_template(template).expect("a valid template"));
    b
}

fn validate(a: &BenchArgs) -> Result<()> {
    crate::cli::at_least_one(&[
        (Some(a.prompt), "-p/--prompt"),
        (Some(a.gen), "-g/--gen"),
        (Some(a.runs), "-r/--runs"),
        (Some(a.prefill_chunk), "--prefill-chunk"),
    ])?;
    match a.batch {
        Some(b) => crate::cli::one_to("--batch", b, MAX_BATCH),
        None => Ok(()),
    }
}

/// The most rows `--batch` times (serve's own batches are far smaller).
const MAX_BATCH: usize = 1024;

/// The model to bench, loaded under `policy` for `device`, and how the table names it.
fn model(
    global: &Global,
    a: &BenchArgs,
    policy: DTypePolicy,
    device: &str,
) -> Result<((Transformer, DTypePlan), String)> {
    ensure!(
        !a.f32_norms || a.preset.is_some(),
        "--f32-norms changes a --preset's random weights; it does not apply to --model"
    );
    ensure!(
        a.seed.is_none() || a.preset.is_some(),
        "--seed picks a --preset's random weights; it does not apply to --model"
    );
    match (&a.preset, &global.model) {
        (Some(_), Some(_)) => bail!("give either --preset or --model, not both"),
        (None, None) => bail!("bench needs --preset NAME or --model PATH"),
        (Some(p), None) => {
            let preset = mlxcel_models::synth::preset(p)?;
            let b = bar(0, "building random weights {bar:40} {pos}/{len} layers ({eta})", a.json);
            let opts = SynthOptions { f32_norms: a.f32_norms };
            let m = mlxcel_models::synth::tensors_with(preset, a.seed.unwrap_or(0), opts, &mut |done, total| {
                b.set_length(total as u64);
                b.set_position(done as u64);
            })?;
            b.finish_and_clear();
            let what = if a.f32_norms {
                format!("{p} (f32 norms)")
            } else {
                p.clone()
            };
            Ok((mlxcel_models::synth::from_tensors_for(m, policy, device)?, what))
        }
        (None, Some(m)) => Ok((crate::progress::load_model(m, policy, device)?, m.display().to_string())),
    }
}

fn gb(bytes: f64) -> String {
    match bytes {
        b if b >= 1e9 => format!("{:.2} GB", b / 1e9),
        b => format!("{:.1} MB", b / 1e6),
    }
}

fn pm((mean, std): (f64, f64)) -> String {
    format!("{mean:.1} ± {std:.1}")
}

pub fn command(global: &Global, a: BenchArgs) -> Result<()> {
    if a.list_presets {
        for p in mlxcel_models::synth::PRESETS {
            println!("{}", p.name);
        }
        return Ok(());
    }
    validate(&a)?;
    let context = a.prompt + a.gen;
    // --graph-only needs no device: the policy is the named device's, the graph what it runs.
    let (backend, device) = match (a.graph_only, global.device) {
        (true, Device::Cuda) => (None, "cuda"),
        (true, Device::Cpu) => (None, "cpu"),
        _ => {
            let b = crate::backend(global.device)?;
            let name = b.name();
            (Some(b), name)
        }
    };
    let (policy, _) = crate::dtype::resolve(global.dtype.as_deref(), global.model.as_deref())?;
    let ((model, plan), what) = model(global, &a, policy, device)?;
    let Some(backend) = backend else {
        return graph_only(global, &a, model, &plan, device, &what, context);
    };
    // (Counting a step's nodes and launches needs no positions the model was trained on.)
    ensure!(
        context <= model.spec.max_position,
        "-p {} plus -g {} exceeds the model's context of {} positions",
        a.prompt,
        a.gen,
        model.spec.max_position
    );
    if let Some(rows) = a.batch {
        return batched(&a, model, &plan, backend.as_ref(), &what, device, rows);
    }
    let vocab = model.spec.vocab as u64;
    let dtype = plan.activation_dtype(&model);
    // Counted on a cache of the size the runs use; the count per position does not depend on it.
    let traffic = decode_traffic(&model, dtype, context)?;
    let mut engine = Engine::for_plan(model, backend, &plan, Some(context))?;
    crate::trace::configure(&mut engine, global);
    let mut rng = SplitMix64(7);
    let prompt: Vec<u32> = (0..a.prompt).map(|_| rng.below(vocab) as u32).collect();
    let opts = GenerateOptions {
        max_tokens: a.gen,
        sampler: SamplerSettings::default(),
        prefill_chunk: a.prefill_chunk,
    };
    let progress = bar(
        ((a.runs + 1) * a.gen) as u64,
        "{msg} {bar:40} {pos}/{len} tokens ({eta})",
        a.json,
    );
    let (mut prefill, mut decode) = (Vec::new(), Vec::new());
    let mut device_used: Option<usize> = None;
    for run in 0..=a.runs {
        let label = if run == 0 {
            "warm-up".to_string()
        } else {
            format!("run {run}/{}", a.runs)
        };
        progress.set_message(label.clone());
        let g = engine
            .generate(&prompt, &opts, &|_| false, |_| {
                progress.inc(1);
                Ok(true)
            })
            .context("bench run")?;
        if let Some(used) = engine.backend().device_memory_used()? {
            device_used = Some(device_used.unwrap_or(0).max(used));
        }
        if run > 0 {
            prefill.push(g.prompt_tps);
            decode.push(g.decode_tps);
        }
        if !a.json {
            progress.suspend(|| {
                eprintln!(
                    "{label}: prefill {:.1} tok/s, decode {:.1} tok/s",
                    g.prompt_tps, g.decode_tps
                )
            });
        }
    }
    progress.finish_and_clear();
    let session = engine.memory();
    let host_peak = crate::generate::peak_memory_bytes();
    // Measured last: its buffers must not count in the peaks above.
    let copy = match engine.backend().copy_bandwidth() {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!("copy bandwidth not measured: {e}");
            None
        }
    };

    // Decode steps run at kv lengths prompt+1 ..= prompt+gen-1.
    let mean_context = a.prompt as f64 + a.gen as f64 / 2.0;
    let per_token = traffic.per_token(mean_context);
    let ms: Vec<f64> = decode.iter().map(|d| 1e3 / d.max(1e-9)).collect();
    let achieved: Vec<f64> = decode.iter().map(|d| d * per_token).collect();
    let (bw_mean, bw_std) = mean_std(&achieved);
    let share = copy.map(|c| bw_mean / c);
    let session_bytes = session.planned_bytes + session.state_bytes + session.parameter_bytes;
    // The figure for "peak device memory": what the driver saw in use on a GPU; on the CPU,
    // whose device memory is host memory, the process's peak resident set.
    let peak = device_used.unwrap_or(host_peak as usize);
    let counts = crate::trace::report(&engine)?;

    if a.json {
        let (pf, dc, mt) = (mean_std(&prefill), mean_std(&decode), mean_std(&ms));
        let obj = json!({
            "model": what, "preset": a.preset, "seed": a.preset.as_ref().map(|_| a.seed.unwrap_or(0)), "device": device, "dtype": dtype.name(),
            "prompt": a.prompt, "gen": a.gen, "generated": a.gen, "runs": a.runs,
            "prefill_tps": prefill, "decode_tps": decode,
            "prefill_tps_mean": pf.0, "prefill_tps_std": pf.1, "prefill_tps_median": median(&prefill),
            "decode_tps_mean": dc.0, "decode_tps_std": dc.1, "decode_tps_median": median(&decode),
            "ms_per_token_mean": mt.0, "ms_per_token_std": mt.1,
            "parameter_bytes": traffic.parameters, "weight_bytes_per_token": traffic.weights,
            "kv_bytes_per_position": traffic.kv_per_position, "mean_context": mean_context,
            "bytes_per_token": per_token,
            "achieved_gbps_mean": bw_mean / 1e9, "achieved_gbps_std": bw_std / 1e9,
            "copy_gbps": copy.map(|c| c / 1e9), "bandwidth_share": share,
            "peak_memory_bytes": peak, "peak_host_memory_bytes": host_peak,
            "device_memory_used_bytes": device_used, "session_bytes": session_bytes,
            "session_memory": {
                "planned_bytes": session.planned_bytes, "state_bytes": session.state_bytes,
                "parameter_bytes": session.parameter_bytes,
            },
        });
        println!(
            "{}",
            crate::trace::merge(obj, crate::trace::json_fields(&engine, counts))
        );
        return Ok(());
    }
    println!(
        "| model | device | dtype | p | g | prefill tok/s | decode tok/s | ms/token | read/token | GB/s | of copy BW | peak memory |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {what} | {device} | {} ({}) | {} | {} | {} | {} | {:.2} ± {:.2} | {} | {} | {} | {} |",
        dtype.name(),
        plan.policy.name(),
        a.prompt,
        a.gen,
        pm(mean_std(&prefill)),
        pm(mean_std(&decode)),
        mean_std(&ms).0,
        mean_std(&ms).1,
        gb(per_token),
        pm((bw_mean / 1e9, bw_std / 1e9)),
        share.map_or("–".into(), |s| format!("{:.0}%", s * 100.0)),
        gb(peak as f64),
    );
    println!();
    println!(
        "{} runs after a warm-up, mean ± standard deviation. read/token: {} of weights (of {} held; \
         a table only gathered from counts one row) + {} of KV cache at the mean context of {mean_context:.0}.",
        a.runs,
        gb(traffic.weights),
        gb(traffic.parameters as f64),
        gb(traffic.kv_fixed as f64 + traffic.kv_per_position as f64 * mean_context),
    );
    match copy {
        Some(c) => println!(
            "copy bandwidth of {device}: {:.1} GB/s (read + written bytes).",
            c / 1e9
        ),
        None => println!("copy bandwidth of {device}: not measured."),
    }
    println!(
        "memory: session {} (activations {}, KV cache {}, weight copies {}); peak resident {}{}.",
        gb(session_bytes as f64),
        gb(session.planned_bytes as f64),
        gb(session.state_bytes as f64),
        gb(session.parameter_bytes as f64),
        gb(host_peak as f64),
        device_used.map_or(String::new(), |u| format!("; device in use {}", gb(u as f64))),
    );
    Ok(())
}

/// `--batch N`: serve's batched decode step (the paged engine, 16-position blocks), timed. Each
/// row starts as if its -p prompt positions were prefilled (their keys and values are the pool's
/// zeros: the figure is speed, not text), then -g steps decode one token a row.
fn batched(
    a: &BenchArgs,
    model: Transformer,
    plan: &DTypePlan,
    backend: &dyn mlxcel_core::Backend,
    what: &str,
    device: &str,
    rows: usize,
) -> Result<()> {
    use mlxcel_engine::paged::{PagedEngine, Row};
    let context = a.prompt + a.gen;
    let table = context.div_ceil(DEFAULT_BLOCK_SIZE);
    let dtype = plan.activation_dtype(&model);
    let mut engine = PagedEngine::new(model, backend, dtype, rows * table, DEFAULT_BLOCK_SIZE, context)?;
    let tables: Vec<Vec<u32>> = (0..rows)
        .map(|r| (0..table).map(|j| (1 + r * table + j) as u32).collect())
        .collect();
    let progress = bar(
        ((a.runs + 1) * a.gen) as u64,
        "{msg} {bar:40} {pos}/{len} steps ({eta})",
        a.json,
    );
    let mut rates = Vec::new();
    for run in 0..=a.runs {
        progress.set_message(if run == 0 {
            "warm-up".to_string()
        } else {
            format!("run {run}/{}", a.runs)
        });
        let mut tokens = vec![1u32; rows];
        let t0 = std::time::Instant::now();
        for step in 0..a.gen {
            let batch: Vec<Row> = (0..rows)
                .map(|r| Row {
                    tokens: &tokens[r..r + 1],
                    start: a.prompt + step,
                    table: &tables[r],
                })
                .collect();
            let out = engine.step(&batch, false).context("batched decode step")?;
            tokens = out.argmax;
            progress.inc(1);
        }
        if run > 0 {
            rates.push((rows * a.gen) as f64 / t0.elapsed().as_secs_f64());
        }
    }
    progress.finish_and_clear();
    let (agg, sd) = mean_std(&rates);
    if a.json {
        let obj = json!({
            "model": what, "device": device, "dtype": dtype.name(), "batch": rows,
            "prompt": a.prompt, "gen": a.gen, "runs": a.runs,
            "aggregate_tps": rates, "aggregate_tps_mean": agg, "aggregate_tps_std": sd,
            "row_tps_mean": agg / rows as f64, "ms_per_step_mean": 1e3 * rows as f64 / agg.max(1e-9),
        });
        println!("{obj}");
        return Ok(());
    }
    println!("| model | device | dtype | rows | positions | aggregate tok/s | tok/s a row | ms/step |");
    println!("|---|---|---|---|---|---|---|---|");
    println!(
        "| {what} | {device} | {} | {rows} | {}..{} | {} | {:.1} | {:.2} |",
        dtype.name(),
        a.prompt,
        context,
        pm((agg, sd)),
        agg / rows as f64,
        1e3 * rows as f64 / agg.max(1e-9)
    );
    println!();
    println!(
        "{} runs after a warm-up, mean ± standard deviation; rows start at position {} as if prefilled (zeros in the cache).",
        a.runs, a.prompt
    );
    Ok(())
}

/// `--graph-only`: the decode step graph at this run's cache size, counted, not run.
fn graph_only(
    global: &Global,
    a: &BenchArgs,
    model: Transformer,
    plan: &DTypePlan,
    device: &str,
    what: &str,
    context: usize,
) -> Result<()> {
    let dtype = GraphDType {
        activations: plan.activation_dtype(&model),
        options: plan.builder_options(),
        policy: plan.policy.name(),
    };
    let capacity = context.max(1); // what bench's engine allocates (its context is the run)
    let (graph, step) = match a.batch {
        Some(rows) => {
            let shape = mlxcel_engine::paged::StepShape::decode(rows, capacity, DEFAULT_BLOCK_SIZE);
            let graph = mlxcel_engine::paged::step_graph(&model, dtype.activations, &shape, false)?;
            (
                graph,
                format!("batched decode step of {what}, {rows} rows of {capacity} positions"),
            )
        }
        None => (
            decode_graph(&model, dtype, &SamplerSettings::default(), capacity)?,
            format!("decode step of {what}, cache {capacity}"),
        ),
    };
    crate::trace::write_dot(&graph, global)?;
    let s = stats::stats(&graph);
    crate::trace::print_graph(&step, &s);
    // On CUDA, the kernels the step launches after fusion, by family (known without a GPU; a
    // build without the cuda feature has no fusion to ask, so it reports none).
    let families = (device == "cuda")
        .then(|| mlxcel_cuda::CudaBackend::launch_families(&graph).ok())
        .flatten();
    let launches = families.as_ref().map(|f| f.iter().map(|(_, n)| n).sum::<usize>());
    if let (Some(n), Some(families)) = (launches, &families) {
        eprintln!("mlxcel: decode step on cuda: {n} kernel launches after fusion");
        for (family, count) in families {
            eprintln!("  {count:>5}  {family}");
        }
    }
    eprintln!(
        "{}",
        crate::trace::summary(s.astype.len(), s.nodes, dtype.policy, device)
    );
    if a.json {
        let obj = serde_json::json!({
            "model": what, "device": device, "astype_per_step": s.astype.len(), "nodes_per_step": s.nodes,
            "launches_per_step": launches,
            "launches_by_family": families.as_ref().map(|f| f.iter().map(|(k, n)| serde_json::json!({"kernel": k, "launches": n})).collect::<Vec<_>>()),
            "dtype_policy": dtype.policy, "activation_dtype": dtype.activations.short(),
            "tensor_dtype": plan.tensors.map(|d| d.short()),
            "astype": s.astype_breakdown().iter().map(|g| g.to_string()).collect::<Vec<_>>(),
        });
        println!("{obj}");
    } else {
        println!("| model | policy | backend | activations | AsType per step | nodes per step |");
        println!("|---|---|---|---|---|---|");
        println!(
            "| {what} | {} | {device} | {} | {} | {} |",
            dtype.policy,
            dtype.activations,
            s.astype.len(),
            s.nodes
        );
    }
    Ok(())
}
