//! `mlxcel convert`: the written folder runs in the engine exactly like its source (lossless), or
//! close to it (requantized), and bad input is one clear error.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};

fn mlxcel(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mlxcel"))
        .args(args)
        .output()
        .expect("mlxcel runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn fixture(case: &str) -> String {
    format!("{}/tests/fixtures/parity/{case}", env!("CARGO_MANIFEST_DIR"))
}

/// A fresh, empty scratch path (not created) for one test.
fn scratch(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("mlxcel-convert-{tag}-{}", std::process::id()));
    std::fs::remove_dir_all(&p).ok();
    std::fs::remove_file(&p).ok();
    p
}

fn convert(from: &str, out: &Path, extra: &[&str]) {
    let mut args = vec!["convert", "--from", from, "--out", out.to_str().unwrap()];
    args.extend(extra);
    let o = mlxcel(&args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    assert!(stderr(&o).contains("wrote"), "{}", stderr(&o));
}

fn json_out(o: &Output) -> Value {
    assert!(o.status.success(), "{}", stderr(o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}): {:?}", o.stdout))
}

/// Per-token NLL the engine computes for `tokens` on the CPU.
fn nll(model: &str, tokens: &[u64]) -> Vec<f64> {
    let ids: Vec<String> = tokens.iter().map(u64::to_string).collect();
    let j = json_out(&mlxcel(&[
        "-m",
        model,
        "--device",
        "cpu",
        "perplexity",
        "--tokens",
        &ids.join(","),
        "--json",
    ]));
    j["nll"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect()
}

fn reference_prompt(case: &str) -> Vec<u64> {
    let text = std::fs::read_to_string(format!("{}/reference.json", fixture(case))).unwrap();
    let r: Value = serde_json::from_str(&text).unwrap();
    r["prompt_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

fn config(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap()
}

fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

#[test]
fn folder_conversion_keeps_every_nll_exactly() {
    for case in ["qwen3-q4g64", "llama-bf16"] {
        let out = scratch(case);
        convert(&fixture(case), &out, &[]);
        let tokens = reference_prompt(case);
        assert_eq!(
            nll(out.to_str().unwrap(), &tokens),
            nll(&fixture(case), &tokens),
            "{case}"
        );
        let c = config(&out);
        assert_eq!(c["tie_word_embeddings"], json!(false), "{case}: written out for mlx-lm");
        match case {
            "qwen3-q4g64" => assert_eq!(
                (&c["quantization"]["bits"], &c["quantization"]["group_size"]),
                (&json!(4), &json!(64))
            ),
            _ => assert!(c.get("quantization").is_none(), "{case}: dense stays dense"),
        }
        let header = std::fs::read(out.join("model.safetensors")).unwrap();
        assert!(String::from_utf8_lossy(&header[..4096.min(header.len())]).contains(r#""format":"mlx""#));
        std::fs::remove_dir_all(&out).ok();
    }
}

#[test]
fn folder_tokenizer_files_are_copied_byte_for_byte() {
    let out = scratch("tok");
    convert(&fixture("llama-bf16"), &out, &[]);
    for name in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        let a = std::fs::read(Path::new(&fixture("llama-bf16")).join(name)).unwrap();
        assert_eq!(std::fs::read(out.join(name)).unwrap(), a, "{name}");
    }
    std::fs::remove_dir_all(&out).ok();
}

/// The fixtures are random-weight models with sharp logits, so single positions move more than
/// on a trained model: mlx-lm's own 8-bit group-32 quantization of llama-bf16 moves them by up to
/// 0.18 too (mlxcel's requantized weights are bit-identical to `mx.quantize`'s).
#[test]
fn requantizing_to_8_bit_group_32_stays_close() {
    for case in ["llama-bf16", "qwen3-q4g64"] {
        let out = scratch(&format!("q8-{case}"));
        convert(&fixture(case), &out, &["--quantize", "8", "--group-size", "32"]);
        let c = config(&out);
        assert_eq!(c["quantization"]["bits"], json!(8), "{case}");
        assert_eq!(c["quantization"]["group_size"], json!(32), "{case}");
        assert_eq!(c["quantization"]["mode"], json!("affine"), "{case}");
        let tokens = reference_prompt(case);
        let (a, b) = (nll(out.to_str().unwrap(), &tokens), nll(&fixture(case), &tokens));
        let mean = (a.iter().sum::<f64>() - b.iter().sum::<f64>()) / a.len() as f64;
        let max = max_diff(&a, &b);
        assert!(max > 0.0, "{case}: requantization changes the weights");
        assert!(
            mean.abs() < 0.03 && max < 0.25,
            "{case}: mean NLL moved by {mean}, one position by {max}"
        );
        std::fs::remove_dir_all(&out).ok();
    }
}

fn fails_with(args: &[&str], needle: &str) {
    let o = mlxcel(args);
    let e = stderr(&o);
    assert!(!o.status.success(), "{args:?} should fail; stderr: {e}");
    assert!(
        e.starts_with("mlxcel: error:") && e.contains(needle),
        "{args:?}: expected {needle:?} in: {e}"
    );
    assert_eq!(e.trim_end().lines().count(), 1, "{args:?}: one line: {e}");
}

#[test]
fn bad_input_is_one_clear_error_and_writes_nothing() {
    let m = fixture("llama-bf16");
    let out = scratch("bad");
    let o = out.to_str().unwrap();
    fails_with(
        &["convert", "--from", "/no/such/model", "--out", o],
        "no such file or folder",
    );
    fails_with(
        &["convert", "--from", &m, "--out", o, "--quantize", "3"],
        "--quantize 3",
    );
    fails_with(
        &[
            "convert",
            "--from",
            &m,
            "--out",
            o,
            "--quantize",
            "4",
            "--group-size",
            "48",
        ],
        "--group-size 48",
    );
    fails_with(
        &["convert", "--from", &m, "--out", o, "--group-size", "32"],
        "only with --quantize",
    );
    let cfg = format!("{m}/config.json");
    fails_with(
        &["convert", "--from", &cfg, "--out", o],
        "expected a .gguf file or a model folder",
    );
    assert!(!out.exists(), "nothing is written for bad input");

    std::fs::write(&out, "a file").unwrap();
    fails_with(&["convert", "--from", &m, "--out", o], "not a folder");
    std::fs::remove_file(&out).unwrap();

    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("model-00001-of-00002.safetensors"), "stale").unwrap();
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    fails_with(&["convert", "--from", &m, "--out", o], "--force");
    convert(&m, &out, &["--force"]);
    assert!(
        !out.join("model-00001-of-00002.safetensors").exists(),
        "stale shards go"
    );
    assert!(out.join("notes.txt").exists(), "other files stay");
    fails_with(
        &["convert", "--from", &m, "--out", &m, "--force"],
        "is the --from folder",
    );
    std::fs::remove_dir_all(&out).ok();

    let no_config = scratch("noconfig");
    std::fs::create_dir_all(&no_config).unwrap();
    let nc = no_config.to_str().unwrap();
    fails_with(&["convert", "--from", nc, "--out", o], "config.json");
    std::fs::remove_dir_all(&no_config).ok();
}

// ---- a tiny llama GGUF, written here from the spec ---------------------------------------------

struct Gguf {
    kvs: Vec<u8>,
    n_kv: u64,
    infos: Vec<u8>,
    n_tensors: u64,
    data: Vec<u8>,
}

enum Meta<'a> {
    U32(u32),
    F32(f32),
    Bool(bool),
    Str(&'a str),
    Strs(Vec<String>),
    I32s(Vec<i32>),
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

impl Gguf {
    fn kv(&mut self, key: &str, v: Meta) {
        put_str(&mut self.kvs, key);
        let out = &mut self.kvs;
        match v {
            Meta::U32(x) => {
                out.extend(4u32.to_le_bytes());
                out.extend(x.to_le_bytes());
            }
            Meta::F32(x) => {
                out.extend(6u32.to_le_bytes());
                out.extend(x.to_le_bytes());
            }
            Meta::Bool(x) => {
                out.extend(7u32.to_le_bytes());
                out.push(x as u8);
            }
            Meta::Str(s) => {
                out.extend(8u32.to_le_bytes());
                put_str(out, s);
            }
            Meta::Strs(v) => {
                out.extend(9u32.to_le_bytes());
                out.extend(8u32.to_le_bytes());
                out.extend((v.len() as u64).to_le_bytes());
                v.iter().for_each(|s| put_str(out, s));
            }
            Meta::I32s(v) => {
                out.extend(9u32.to_le_bytes());
                out.extend(5u32.to_le_bytes());
                out.extend((v.len() as u64).to_le_bytes());
                v.iter().for_each(|x| out.extend(x.to_le_bytes()));
            }
        }
        self.n_kv += 1;
    }

    /// `ne` innermost first, as GGUF stores shapes.
    fn tensor(&mut self, name: &str, ne: &[u64], ty: u32, bytes: &[u8]) {
        self.data.resize(self.data.len().next_multiple_of(32), 0);
        put_str(&mut self.infos, name);
        self.infos.extend((ne.len() as u32).to_le_bytes());
        ne.iter().for_each(|d| self.infos.extend(d.to_le_bytes()));
        self.infos.extend(ty.to_le_bytes());
        self.infos.extend((self.data.len() as u64).to_le_bytes());
        self.data.extend(bytes);
        self.n_tensors += 1;
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(self.n_tensors.to_le_bytes());
        out.extend(self.n_kv.to_le_bytes());
        out.extend(&self.kvs);
        out.extend(&self.infos);
        out.resize(out.len().next_multiple_of(32), 0);
        out.extend(&self.data);
        out
    }
}

/// Deterministic small integers.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u32) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as u32
    }
}

fn f16_bytes(v: f32) -> [u8; 2] {
    half_bits(v).to_le_bytes()
}

/// f32 → IEEE half for the exactly representable values used here (normal, short mantissa).
fn half_bits(v: f32) -> u16 {
    let b = v.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
    let mant = ((b >> 13) & 0x3ff) as u16;
    if v == 0.0 {
        return sign;
    }
    sign | ((exp as u16) << 10) | mant
}

/// `rows × cols` blocks of one type: Q8_0 (8), Q4_0 (2), Q4_1 (3), F16 (1) or F32 (0).
fn matrix(rng: &mut Lcg, ty: u32, rows: usize, cols: usize, norm: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rows {
        for _ in 0..cols / 32 {
            match ty {
                8 => {
                    out.extend(f16_bytes(1.0 / 512.0));
                    (0..32).for_each(|_| out.push((rng.below(121) as i32 - 60) as i8 as u8));
                }
                2 => {
                    out.extend(f16_bytes(1.0 / 64.0));
                    (0..16).for_each(|_| out.push((rng.below(16) | (rng.below(16) << 4)) as u8));
                }
                3 => {
                    out.extend(f16_bytes(1.0 / 64.0));
                    out.extend(f16_bytes(-0.125));
                    (0..16).for_each(|_| out.push((rng.below(16) | (rng.below(16) << 4)) as u8));
                }
                1 => (0..32).for_each(|_| out.extend(f16_bytes((rng.below(64) as f32 - 32.0) / 256.0))),
                _ => (0..32).for_each(|_| {
                    let v = (rng.below(64) as f32 - 32.0) / 256.0;
                    out.extend((if norm { 1.0 + v } else { v }).to_le_bytes())
                }),
            }
        }
    }
    out
}

const TEMPLATE: &str = "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}";

/// One decoder layer, 64 wide, vocab 100 (printable ASCII, Ġ, three merges, <s>, </s>), every
/// tensor type the reader maps to MLX affine or dense.
fn tiny_gguf(path: &Path) {
    let mut tokens: Vec<String> = (b'!'..=b'~').map(|c| (c as char).to_string()).collect();
    tokens.extend(["Ġ", "he", "ll", "Ġw", "<s>", "</s>"].map(String::from));
    let types: Vec<i32> = (0..tokens.len()).map(|i| if i >= 98 { 3 } else { 1 }).collect();
    let mut g = Gguf {
        kvs: Vec::new(),
        n_kv: 0,
        infos: Vec::new(),
        n_tensors: 0,
        data: Vec::new(),
    };
    g.kv("general.architecture", Meta::Str("llama"));
    g.kv("llama.block_count", Meta::U32(1));
    g.kv("llama.embedding_length", Meta::U32(64));
    g.kv("llama.feed_forward_length", Meta::U32(128));
    g.kv("llama.attention.head_count", Meta::U32(2));
    g.kv("llama.attention.head_count_kv", Meta::U32(1));
    g.kv("llama.attention.layer_norm_rms_epsilon", Meta::F32(1e-5));
    g.kv("llama.rope.freq_base", Meta::F32(10000.0));
    g.kv("llama.context_length", Meta::U32(128));
    g.kv("tokenizer.ggml.model", Meta::Str("gpt2"));
    g.kv("tokenizer.ggml.pre", Meta::Str("gpt2"));
    g.kv("tokenizer.ggml.tokens", Meta::Strs(tokens));
    g.kv("tokenizer.ggml.token_type", Meta::I32s(types));
    g.kv(
        "tokenizer.ggml.merges",
        Meta::Strs(["h e", "l l", "Ġ w"].map(String::from).to_vec()),
    );
    g.kv("tokenizer.ggml.bos_token_id", Meta::U32(98));
    g.kv("tokenizer.ggml.eos_token_id", Meta::U32(99));
    g.kv("tokenizer.ggml.add_bos_token", Meta::Bool(true));
    g.kv("tokenizer.chat_template", Meta::Str(TEMPLATE));
    let mut rng = Lcg(7);
    let (d, ffn, vocab) = (64usize, 128usize, 100usize);
    let mut t = |name: &str, ty: u32, rows: usize, cols: usize| {
        let norm = name.ends_with("norm.weight");
        let bytes = matrix(&mut rng, ty, rows, cols, norm);
        let ne: Vec<u64> = if rows == 1 {
            vec![cols as u64]
        } else {
            vec![cols as u64, rows as u64]
        };
        g.tensor(name, &ne, ty, &bytes);
    };
    t("token_embd.weight", 8, vocab, d);
    t("blk.0.attn_norm.weight", 0, 1, d);
    t("blk.0.attn_q.weight", 2, d, d);
    t("blk.0.attn_k.weight", 8, 32, d);
    t("blk.0.attn_v.weight", 1, 32, d);
    t("blk.0.attn_output.weight", 3, d, d);
    t("blk.0.ffn_norm.weight", 0, 1, d);
    t("blk.0.ffn_gate.weight", 8, ffn, d);
    t("blk.0.ffn_up.weight", 2, ffn, d);
    t("blk.0.ffn_down.weight", 3, d, ffn);
    t("output_norm.weight", 0, 1, d);
    t("output.weight", 1, vocab, d);
    std::fs::write(path, g.bytes()).unwrap();
}

fn prompt_tokens(model: &str, text: &str, template: bool) -> Value {
    let mut args = vec!["-m", model, "--device", "cpu", "generate", text, "-n", "1", "--json"];
    if !template {
        args.push("--no-chat-template");
    }
    json_out(&mlxcel(&args))["prompt_tokens"].clone()
}

#[test]
fn gguf_conversion_keeps_nll_and_tokenizer() {
    let dir = scratch("gguf");
    std::fs::create_dir_all(&dir).unwrap();
    let gguf = dir.join("tiny.gguf");
    tiny_gguf(&gguf);
    let g = gguf.to_str().unwrap();
    let out = dir.join("mlx");
    convert(g, &out, &[]);
    let o = out.to_str().unwrap();

    let tokens = [98, 7, 4, 94, 95, 96, 97, 14, 50, 61, 3, 9, 99, 98, 42];
    assert_eq!(nll(o, &tokens), nll(g, &tokens), "lossless");
    let c = config(&out);
    assert_eq!(c["tie_word_embeddings"], json!(false));
    assert_eq!(c["rope_traditional"], json!(false));
    assert_eq!(
        c["quantization"]["model.layers.0.self_attn.v_proj"],
        json!(false),
        "F16 stays dense"
    );
    assert_eq!(c["quantization"]["model.embed_tokens"]["bits"], json!(8));
    assert_eq!(c["quantization"]["bits"], json!(4), "Q4_0/Q4_1 are the most common");

    for (text, template) in [("hello world", false), ("hello world", true)] {
        let want = prompt_tokens(g, text, template);
        assert_eq!(prompt_tokens(o, text, template), want, "{text:?} template={template}");
        assert_eq!(want[0], json!(98), "BOS first");
    }
    let tc: Value = serde_json::from_str(&std::fs::read_to_string(out.join("tokenizer_config.json")).unwrap()).unwrap();
    assert_eq!(tc["chat_template"], json!(TEMPLATE));
    assert_eq!((&tc["bos_token"], &tc["eos_token"]), (&json!("<s>"), &json!("</s>")));
    assert_eq!(tc["add_bos_token"], json!(true));

    let q = dir.join("q8");
    convert(g, &q, &["--quantize", "8", "--group-size", "32"]);
    let d = max_diff(&nll(q.to_str().unwrap(), &tokens), &nll(g, &tokens));
    assert!(d > 0.0 && d < 0.02, "8-bit requantization: max NLL difference {d}");
    let c = config(&q);
    assert!(
        c["quantization"].get("model.layers.0.self_attn.v_proj").is_none(),
        "all requantized"
    );
    std::fs::remove_dir_all(&dir).ok();
}
