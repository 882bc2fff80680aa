//! `mlxcel demo`: a tiny random-weight decoder (quantized linears, GQA attention over a KV
//! cache, RoPE, RMSNorm, SwiGLU) built as prefill and decode graphs and run end to end. It
//! exercises the engine before real checkpoints load; the tokens it prints mean nothing.

use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use mlxcel_core::rng::SplitMix64;
use mlxcel_core::{quant, stats, Backend, CompileOptions, DType, Graph, GraphBuilder, HostTensor, NodeId};

pub struct DemoConfig {
    pub layers: usize,
    pub dim: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub vocab: usize,
    pub capacity: usize,
    pub activations: DType,
}

const BITS: u32 = 4;
const GROUP: usize = 32;

struct Weights {
    embed: HostTensor,
    lm_head: (HostTensor, HostTensor, HostTensor),
    norms: Vec<HostTensor>,
    /// Per layer: q, k, v, o, gate, up, down as (packed, scales, biases).
    linears: Vec<[(HostTensor, HostTensor, HostTensor); 7]>,
}

fn quantized(rng: &mut SplitMix64, out: usize, inp: usize) -> Result<(HostTensor, HostTensor, HostTensor)> {
    let w = rng.signed_vec(out * inp, 1.0 / (inp as f32).sqrt());
    let q = quant::quantize(&w, out, inp, BITS, GROUP);
    let groups = [out, inp / GROUP];
    Ok((
        HostTensor::from_slice(&[out, inp * BITS as usize / 32], &q.packed)?,
        HostTensor::from_f32(DType::BF16, &groups, &q.scales)?,
        HostTensor::from_f32(DType::BF16, &groups, &q.biases)?,
    ))
}

impl Weights {
    fn random(c: &DemoConfig) -> Result<Weights> {
        let mut rng = SplitMix64(42);
        let hd = c.dim / c.heads;
        let (d, kv, ff) = (c.dim, c.kv_heads * hd, 3 * c.dim);
        let mut linears = Vec::new();
        for _ in 0..c.layers {
            let shapes = [(d, d), (kv, d), (kv, d), (d, d), (ff, d), (ff, d), (d, ff)];
            let mut ws = Vec::new();
            for (o, i) in shapes {
                ws.push(quantized(&mut rng, o, i)?);
            }
            linears.push(ws.try_into().map_err(|_| anyhow::anyhow!("seven linears"))?);
        }
        let ones = vec![1.0; d];
        Ok(Weights {
            embed: HostTensor::from_f32(DType::BF16, &[c.vocab, d], &rng.signed_vec(c.vocab * d, 1.0))?,
            lm_head: quantized(&mut rng, c.vocab, d)?,
            norms: (0..2 * c.layers + 1)
                .map(|_| HostTensor::from_f32(DType::F32, &[d], &ones))
                .collect::<Result<_, _>>()?,
            linears,
        })
    }
}

/// One step over `t` tokens: inputs `tokens [1, t]`, `positions [t]`, `offset []`; output the
/// greedy next token.
fn build_step(c: &DemoConfig, w: &Weights, t: usize) -> Result<Graph> {
    let mut b = GraphBuilder::default();
    let hd = c.dim / c.heads;
    let tokens = b.input("tokens", DType::I32, &[1, t]);
    let positions = b.input("positions", DType::I32, &[t]);
    let offset = b.input("offset", DType::I32, &[]);
    let kv_len = b.add_scalar(offset, t as f32)?;
    let inv_freq: Vec<f32> = (0..hd / 2)
        .map(|i| 10000f32.powf(-2.0 * i as f32 / hd as f32))
        .collect();
    let inv_freq = b.constant(HostTensor::from_f32(DType::F32, &[hd / 2], &inv_freq)?);
    let embed = b.parameter("embed_tokens.weight", w.embed.clone());
    let x = b.gather(embed, tokens)?;
    let mut x = b.astype(x, c.activations);
    for l in 0..c.layers {
        b.set_layer(Some(l as u32));
        let lin = &w.linears[l];
        let linear = |b: &mut GraphBuilder, h: NodeId, k: usize, name: &str| -> Result<NodeId> {
            let (q, s, z) = &lin[k];
            let (q, s, z) = (
                b.parameter(name, q.clone()),
                b.parameter(name, s.clone()),
                b.parameter(name, z.clone()),
            );
            let y = b.quantized_matmul(h, q, s, z, BITS, GROUP)?;
            Ok(b.name(y, name))
        };
        let norm = b.parameter("input_layernorm.weight", w.norms[2 * l].clone());
        let h = b.rms_norm(x, norm, 1e-5, false)?;
        let h = b.name(h, "attn_norm");
        let heads = |b: &mut GraphBuilder, k: usize, name: &str, n: usize| -> Result<NodeId> {
            let y = linear(b, h, k, name)?;
            let y = b.reshape(y, &[1, t, n, hd])?;
            Ok(b.swap_axes(y, 1, 2)?)
        };
        let q = heads(&mut b, 0, "q_proj", c.heads)?;
        let k = heads(&mut b, 1, "k_proj", c.kv_heads)?;
        let v = heads(&mut b, 2, "v_proj", c.kv_heads)?;
        let q = b.rope(q, positions, inv_freq, hd, false, 1.0)?;
        let k = b.rope(k, positions, inv_freq, hd, false, 1.0)?;
        let cache_shape = [1, c.kv_heads, c.capacity, hd];
        let kc = b.state(&format!("layers.{l}.k_cache"), c.activations, &cache_shape);
        let vc = b.state(&format!("layers.{l}.v_cache"), c.activations, &cache_shape);
        let kc = b.kv_write(kc, k, offset)?;
        let vc = b.kv_write(vc, v, offset)?;
        let a = b.attention(q, kc, vc, kv_len, 1.0 / (hd as f32).sqrt(), true, None, None)?;
        let a = b.swap_axes(a, 1, 2)?;
        let a = b.reshape(a, &[1, t, c.dim])?;
        let o = linear(&mut b, a, 3, "o_proj")?;
        x = b.add(x, o)?;
        let norm = b.parameter("post_attention_layernorm.weight", w.norms[2 * l + 1].clone());
        let h = b.rms_norm(x, norm, 1e-5, false)?;
        let gate = linear(&mut b, h, 4, "gate_proj")?;
        let up = linear(&mut b, h, 5, "up_proj")?;
        let gate = b.silu(gate)?;
        let m = b.mul(gate, up)?;
        let down = linear(&mut b, m, 6, "down_proj")?;
        x = b.add(x, down)?;
        b.name(x, "residual");
    }
    b.set_layer(None);
    let norm = b.parameter("norm.weight", w.norms[2 * c.layers].clone());
    let last = b.slice_axis(x, 1, t - 1, t)?;
    let h = b.rms_norm(last, norm, 1e-5, false)?;
    let (q, s, z) = &w.lm_head;
    let (q, s, z) = (
        b.parameter("lm_head", q.clone()),
        b.parameter("lm_head", s.clone()),
        b.parameter("lm_head", z.clone()),
    );
    let logits = b.quantized_matmul(h, q, s, z, BITS, GROUP)?;
    let logits = b.reshape(logits, &[1, c.vocab])?;
    let next = b.argmax(logits, -1)?;
    Ok(b.finish(&[next]))
}

pub struct DemoReport {
    pub prompt: Vec<i32>,
    pub generated: Vec<u32>,
    pub decode_graph: Graph,
    pub prefill_s: f64,
    pub decode_s: f64,
    pub memory: mlxcel_core::MemoryReport,
}

pub fn run(c: &DemoConfig, backend: &dyn Backend, prompt: &[i32], steps: usize) -> Result<DemoReport> {
    ensure!(!prompt.is_empty(), "the prompt needs at least one token");
    ensure!(
        prompt.len() + steps <= c.capacity,
        "prompt plus steps exceed the KV capacity {}",
        c.capacity
    );
    ensure!(
        c.dim.is_multiple_of(GROUP),
        "--dim {} must be a multiple of {GROUP} (the quantization group)",
        c.dim
    );
    ensure!(
        c.dim.is_multiple_of(c.heads) && (c.dim / c.heads).is_multiple_of(2),
        "--dim {} must split into --heads {} heads of an even width",
        c.dim,
        c.heads
    );
    ensure!(
        c.heads.is_multiple_of(c.kv_heads),
        "--heads {} must be a multiple of --kv-heads {}",
        c.heads,
        c.kv_heads
    );
    let w = Weights::random(c)?;
    let passes = mlxcel_core::passes::default_passes();
    let prefill = mlxcel_core::passes::run_passes(&build_step(c, &w, prompt.len())?, &passes)?;
    let decode = mlxcel_core::passes::run_passes(&build_step(c, &w, 1)?, &passes)?;
    let mut session = backend.new_session()?;
    let (pid, did) = (
        session.load(&prefill, CompileOptions::default())?,
        session.load(&decode, CompileOptions::default())?,
    );
    let step_inputs = |tokens: &[i32], offset: usize| -> Result<Vec<HostTensor>> {
        let positions: Vec<i32> = (offset..offset + tokens.len()).map(|p| p as i32).collect();
        Ok(vec![
            HostTensor::from_slice(&[1, tokens.len()], tokens)?,
            HostTensor::from_slice(&[tokens.len()], &positions)?,
            HostTensor::from_slice(&[], &[offset as i32])?,
        ])
    };
    let start = Instant::now();
    let out = session.run(pid, &step_inputs(prompt, 0)?)?;
    let prefill_s = start.elapsed().as_secs_f64();
    let mut next = out[0].to_vec::<u32>()?[0];
    let mut generated = vec![next];
    let start = Instant::now();
    for i in 0..steps.saturating_sub(1) {
        let out = session.run(did, &step_inputs(&[next as i32], prompt.len() + i)?)?;
        next = out[0].to_vec::<u32>()?[0];
        generated.push(next);
    }
    let decode_s = start.elapsed().as_secs_f64();
    Ok(DemoReport {
        prompt: prompt.to_vec(),
        generated,
        decode_graph: decode,
        prefill_s,
        decode_s,
        memory: session.memory(),
    })
}

pub fn print_report(r: &DemoReport) {
    let s = stats::stats(&r.decode_graph);
    println!("prompt tokens: {:?}", r.prompt);
    println!("generated:     {:?}", r.generated);
    eprintln!("decode graph: {} nodes, {} AsType per step", s.nodes, s.astype.len());
    eprint!("{s}");
    let steps = r.generated.len().saturating_sub(1).max(1);
    eprintln!(
        "prefill {} tokens: {:.1} ms; decode: {:.2} ms/token; planned activations {} KiB, KV cache {} KiB",
        r.prompt.len(),
        r.prefill_s * 1e3,
        r.decode_s * 1e3 / steps as f64,
        r.memory.planned_bytes / 1024,
        r.memory.state_bytes / 1024
    );
}

fn parse_ids(s: &str) -> Result<Vec<i32>> {
    s.split(',')
        .map(|t| {
            t.trim()
                .parse::<i32>()
                .with_context(|| format!("bad token id {t:?} in --prompt-tokens"))
        })
        .collect()
}

pub fn command(global: &crate::cli::Global, a: crate::cli::DemoArgs) -> Result<()> {
    let backend = crate::backend(global.device)?;
    let activations = match DType::parse(&a.activations) {
        Some(d) if d.is_float() => d,
        _ => bail!("--activations {}: expected f32, f16 or bf16", a.activations),
    };
    // A demo's sizes: at most about half a billion random weights, built at once in memory.
    for (value, flag, most) in [
        (a.layers, "--layers", 32),
        (a.dim, "--dim", 1024),
        (a.heads, "--heads", 128),
        (a.kv_heads, "--kv-heads", 128),
        (a.vocab, "--vocab", 1 << 16),
        (a.steps, "--steps", 4096),
    ] {
        crate::cli::one_to(flag, value, most)?;
    }
    let prompt = parse_ids(&a.prompt_tokens)?;
    if let Some(bad) = prompt.iter().find(|&&t| t < 0 || t as usize >= a.vocab) {
        bail!("prompt token {bad} is outside the vocabulary 0..{}", a.vocab);
    }
    let config = DemoConfig {
        layers: a.layers,
        dim: a.dim,
        heads: a.heads,
        kv_heads: a.kv_heads,
        vocab: a.vocab,
        capacity: prompt.len() + a.steps,
        activations,
    };
    let report = run(&config, backend.as_ref(), &prompt, a.steps)?;
    if let Some(path) = a.export_dot {
        std::fs::write(&path, stats::to_dot(&report.decode_graph))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    crate::trace::write_dot(&report.decode_graph, global)?;
    print_report(&report);
    if crate::trace::enabled() {
        let s = stats::stats(&report.decode_graph);
        crate::trace::print_graph("demo decode step", &s);
        let policy = format!("fixed {activations}");
        eprintln!(
            "{}",
            crate::trace::summary(s.astype.len(), s.nodes, &policy, backend.name())
        );
    }
    Ok(())
}
