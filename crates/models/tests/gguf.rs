//! GGUF reader: files written here by a small independent writer (blocks built element by
//! element, so expected values are known by construction), a gguf-py fixture for cross-checking,
//! and hostile headers that must be clear errors, never panics.

use std::collections::BTreeMap;
use std::path::PathBuf;

use half::{bf16, f16};
use mlxcel_core::quant::unpack;
use mlxcel_core::DType;
use mlxcel_models::gguf::{GgufFile, MetaType, MetaValue, MlxAffine};

// ggml type ids, written out here rather than taken from the reader.
const F32: u32 = 0;
const F16: u32 = 1;
const Q4_0: u32 = 2;
const Q4_1: u32 = 3;
const Q5_0: u32 = 6;
const Q5_1: u32 = 7;
const Q8_0: u32 = 8;
const Q2_K: u32 = 10;
const Q3_K: u32 = 11;
const Q4_K: u32 = 12;
const Q5_K: u32 = 13;
const Q6_K: u32 = 14;
const IQ2_XXS: u32 = 16;
const BF16: u32 = 30;

// ---------------------------------------------------------------------------------------------
// A GGUF writer, from the spec.

struct Writer {
    magic: [u8; 4],
    version: u32,
    alignment: usize,
    kvs: Vec<u8>,
    n_kv: u64,
    infos: Vec<u8>,
    n_tensors: u64,
    data: Vec<u8>,
}

fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s);
}

fn type_id(v: &MetaValue) -> u32 {
    match v {
        MetaValue::U8(_) => 0,
        MetaValue::I8(_) => 1,
        MetaValue::U16(_) => 2,
        MetaValue::I16(_) => 3,
        MetaValue::U32(_) => 4,
        MetaValue::I32(_) => 5,
        MetaValue::F32(_) => 6,
        MetaValue::Bool(_) => 7,
        MetaValue::String(_) => 8,
        MetaValue::Array(..) => 9,
        MetaValue::U64(_) => 10,
        MetaValue::I64(_) => 11,
        MetaValue::F64(_) => 12,
    }
}

fn elem_type_id(t: MetaType) -> u32 {
    [
        MetaType::U8,
        MetaType::I8,
        MetaType::U16,
        MetaType::I16,
        MetaType::U32,
        MetaType::I32,
        MetaType::F32,
        MetaType::Bool,
        MetaType::String,
        MetaType::Array,
        MetaType::U64,
        MetaType::I64,
        MetaType::F64,
    ]
    .iter()
    .position(|&x| x == t)
    .unwrap() as u32
}

fn put_value(out: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.push(*x as u8),
        MetaValue::U16(x) => out.extend(x.to_le_bytes()),
        MetaValue::I16(x) => out.extend(x.to_le_bytes()),
        MetaValue::U32(x) => out.extend(x.to_le_bytes()),
        MetaValue::I32(x) => out.extend(x.to_le_bytes()),
        MetaValue::F32(x) => out.extend(x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(*x as u8),
        MetaValue::String(s) => put_str(out, s.as_bytes()),
        MetaValue::Array(elem, values) => {
            out.extend(elem_type_id(*elem).to_le_bytes());
            out.extend((values.len() as u64).to_le_bytes());
            for v in values {
                put_value(out, v);
            }
        }
        MetaValue::U64(x) => out.extend(x.to_le_bytes()),
        MetaValue::I64(x) => out.extend(x.to_le_bytes()),
        MetaValue::F64(x) => out.extend(x.to_le_bytes()),
    }
}

impl Writer {
    fn new() -> Writer {
        Writer {
            magic: *b"GGUF",
            version: 3,
            alignment: 32,
            kvs: Vec::new(),
            n_kv: 0,
            infos: Vec::new(),
            n_tensors: 0,
            data: Vec::new(),
        }
    }

    fn kv(mut self, key: &str, v: MetaValue) -> Writer {
        if let (true, Some(a)) = (key == "general.alignment", v.as_u64()) {
            self.alignment = a as usize;
        }
        put_str(&mut self.kvs, key.as_bytes());
        self.kvs.extend(type_id(&v).to_le_bytes());
        put_value(&mut self.kvs, &v);
        self.n_kv += 1;
        self
    }

    /// Raw bytes as one metadata entry (for hostile encodings).
    fn raw_kv(mut self, bytes: &[u8]) -> Writer {
        self.kvs.extend(bytes);
        self.n_kv += 1;
        self
    }

    /// A tensor info only; `ne` innermost first, as GGUF stores it.
    fn info(mut self, name: &str, ne: &[u64], ty: u32, offset: u64) -> Writer {
        put_str(&mut self.infos, name.as_bytes());
        self.infos.extend((ne.len() as u32).to_le_bytes());
        for d in ne {
            self.infos.extend(d.to_le_bytes());
        }
        self.infos.extend(ty.to_le_bytes());
        self.infos.extend(offset.to_le_bytes());
        self.n_tensors += 1;
        self
    }

    /// A tensor info plus its data, placed at the next aligned offset.
    fn tensor(mut self, name: &str, ne: &[u64], ty: u32, bytes: &[u8]) -> Writer {
        self.data.resize(self.data.len().next_multiple_of(self.alignment), 0);
        let offset = self.data.len() as u64;
        self.data.extend(bytes);
        self.info(name, ne, ty, offset)
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = self.magic.to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend(self.n_tensors.to_le_bytes());
        out.extend(self.n_kv.to_le_bytes());
        out.extend(&self.kvs);
        out.extend(&self.infos);
        out.resize(out.len().next_multiple_of(self.alignment), 0);
        out.extend(&self.data);
        out
    }

    fn parse(&self) -> anyhow::Result<GgufFile> {
        GgufFile::parse(&self.bytes())
    }
}

fn err_of(r: anyhow::Result<GgufFile>) -> String {
    format!("{:#}", r.unwrap_err())
}

fn assert_err(r: anyhow::Result<GgufFile>, needle: &str) {
    let msg = err_of(r);
    assert!(msg.contains(needle), "error {msg:?} does not mention {needle:?}");
}

fn h(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_le_bytes()
}

fn hf(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

// ---------------------------------------------------------------------------------------------
// Blocks built element by element from chosen quants and scales.

/// Quants for a block: a permutation-like walk over 0..levels so every level appears.
fn quants(n: usize, levels: u32, seed: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 7 + seed * 3 + i / 5) % levels).collect()
}

/// 32-element types: element i < 16 is the low nibble of qs[i], element i + 16 its high nibble.
fn nibbles(q: &[u32]) -> Vec<u8> {
    (0..16).map(|i| (q[i] & 15 | (q[i + 16] & 15) << 4) as u8).collect()
}

fn q5_high_bits(q: &[u32]) -> [u8; 4] {
    let qh = (0..32).fold(0u32, |acc, i| acc | (q[i] >> 4) << i);
    qh.to_le_bytes()
}

/// A block of `ty` for block number `k` and the values it stands for.
fn block(ty: u32, k: u32) -> (Vec<u8>, Vec<f32>) {
    let d = hf(0.25 + k as f32 * 0.0625);
    let m = hf(-1.25 + k as f32 * 0.375);
    let mut b = Vec::new();
    let want: Vec<f32> = match ty {
        Q4_0 => {
            let q = quants(32, 16, k);
            b.extend(h(d));
            b.extend(nibbles(&q));
            q.iter().map(|&q| (q as f32 - 8.0) * d).collect()
        }
        Q4_1 => {
            let q = quants(32, 16, k);
            b.extend(h(d));
            b.extend(h(m));
            b.extend(nibbles(&q));
            q.iter().map(|&q| q as f32 * d + m).collect()
        }
        Q5_0 => {
            let q = quants(32, 32, k);
            b.extend(h(d));
            b.extend(q5_high_bits(&q));
            b.extend(nibbles(&q));
            q.iter().map(|&q| (q as f32 - 16.0) * d).collect()
        }
        Q5_1 => {
            let q = quants(32, 32, k);
            b.extend(h(d));
            b.extend(h(m));
            b.extend(q5_high_bits(&q));
            b.extend(nibbles(&q));
            q.iter().map(|&q| q as f32 * d + m).collect()
        }
        Q8_0 => {
            let q: Vec<i32> = quants(32, 256, k).iter().map(|&q| q as i32 - 128).collect();
            b.extend(h(d));
            b.extend(q.iter().map(|&q| q as i8 as u8));
            q.iter().map(|&q| q as f32 * d).collect()
        }
        _ => return k_block(ty, k),
    };
    (b, want)
}

/// Inverse of ggml's `get_scale_min_k4`: eight 6-bit scales and mins into 12 bytes.
fn pack_scale_min_k4(sc: &[u32], mn: &[u32]) -> Vec<u8> {
    let mut out = vec![0u8; 12];
    for j in 0..4 {
        out[j] = (sc[j] | (sc[j + 4] >> 4) << 6) as u8;
        out[j + 4] = (mn[j] | (mn[j + 4] >> 4) << 6) as u8;
        out[j + 8] = (sc[j + 4] & 15 | (mn[j + 4] & 15) << 4) as u8;
    }
    out
}

fn k_block(ty: u32, k: u32) -> (Vec<u8>, Vec<f32>) {
    let d = hf(0.0123 + k as f32 * 0.001);
    let dmin = hf(0.0071 + k as f32 * 0.002);
    let mut want = vec![0f32; 256];
    let b = match ty {
        Q4_K | Q5_K => {
            let sc: Vec<u32> = (0..8).map(|j| (j * 9 + 5 + k * 17) % 64).collect();
            let mn: Vec<u32> = (0..8).map(|j| (j * 13 + 60 + k * 5) % 64).collect();
            let bits = if ty == Q4_K { 16 } else { 32 };
            let q = quants(256, bits, k);
            let mut qs = vec![0u8; 128];
            let mut qh = vec![0u8; 32];
            for e in 0..256 {
                let (s, l) = (e / 32, e % 32);
                qs[s / 2 * 32 + l] |= ((q[e] & 15) << (4 * (s % 2))) as u8;
                qh[l] |= ((q[e] >> 4) << s) as u8;
                want[e] = d * sc[s] as f32 * q[e] as f32 - dmin * mn[s] as f32;
            }
            let mut b = [h(d), h(dmin)].concat();
            b.extend(pack_scale_min_k4(&sc, &mn));
            if ty == Q5_K {
                b.extend(qh);
            }
            b.extend(qs);
            b
        }
        Q6_K => {
            // Element e = 128n + 32k + l: low 4 bits in ql[64n + l + 32(k mod 2)] (nibble k / 2),
            // high 2 bits in qh[32n + l] at bit 2k; group e / 16 has a signed 8-bit scale.
            let sc: Vec<i8> = (0..16).map(|g| ((g * 37 + k * 11) % 256) as u8 as i8).collect();
            let q = quants(256, 64, k);
            let (mut ql, mut qh) = (vec![0u8; 128], vec![0u8; 64]);
            for e in 0..256 {
                let (n, kk, l) = (e / 128, e % 128 / 32, e % 32);
                ql[64 * n + l + 32 * (kk % 2)] |= ((q[e] & 15) << (4 * (kk / 2))) as u8;
                qh[32 * n + l] |= ((q[e] >> 4) << (2 * kk)) as u8;
                want[e] = d * sc[e / 16] as f32 * (q[e] as i32 - 32) as f32;
            }
            [ql, qh, sc.iter().map(|&s| s as u8).collect(), h(d).to_vec()].concat()
        }
        Q2_K => {
            // Element e = 128n + 32k + 16h + l: 2 bits of qs[32n + 16h + l] at bit 2k; group
            // e / 16 has a 4-bit scale (low nibble) and min (high nibble).
            let sc: Vec<u32> = (0..16).map(|g| (g * 5 + k) % 16).collect();
            let mn: Vec<u32> = (0..16).map(|g| (g * 11 + 3 + k) % 16).collect();
            let q = quants(256, 4, k);
            let mut qs = vec![0u8; 64];
            for e in 0..256 {
                let (n, kk, hh, l) = (e / 128, e % 128 / 32, e % 32 / 16, e % 16);
                qs[32 * n + 16 * hh + l] |= (q[e] << (2 * kk)) as u8;
                let g = e / 16;
                want[e] = d * sc[g] as f32 * q[e] as f32 - dmin * mn[g] as f32;
            }
            let scales: Vec<u8> = (0..16).map(|g| (sc[g] | mn[g] << 4) as u8).collect();
            [scales, qs, h(d).to_vec(), h(dmin).to_vec()].concat()
        }
        Q3_K => {
            // As Q2_K for the low 2 bits; hmask[16h + l] bit 4n + k set means "no −4"; group
            // g's 6-bit scale (biased by 32): low nibble in byte g (g < 8, low) or g − 8 (high),
            // top 2 bits in byte 8 + g mod 4 at bit 2(g / 4).
            let s: Vec<i32> = (0..16).map(|g| ((g * 23 + k * 7) % 64) as i32 - 32).collect();
            let q: Vec<i32> = quants(256, 8, k).iter().map(|&q| q as i32 - 4).collect();
            let (mut hmask, mut qs, mut scales) = (vec![0u8; 32], vec![0u8; 64], vec![0u8; 12]);
            for e in 0..256 {
                let (n, kk, hh, l) = (e / 128, e % 128 / 32, e % 32 / 16, e % 16);
                let low = if q[e] >= 0 { q[e] } else { q[e] + 4 };
                qs[32 * n + 16 * hh + l] |= (low << (2 * kk)) as u8;
                if q[e] >= 0 {
                    hmask[16 * hh + l] |= 1 << (4 * n + kk);
                }
                want[e] = d * s[e / 16] as f32 * q[e] as f32;
            }
            for (g, &s) in s.iter().enumerate() {
                let u = (s + 32) as u8;
                if g < 8 {
                    scales[g] |= u & 15;
                } else {
                    scales[g - 8] |= (u & 15) << 4;
                }
                scales[8 + g % 4] |= (u >> 4) << (2 * (g / 4));
            }
            [hmask, qs, scales, h(d).to_vec()].concat()
        }
        _ => unreachable!(),
    };
    (b, want)
}

/// `rows` rows of `blocks_per_row` blocks of `ty`, and their values.
fn matrix(ty: u32, rows: usize, blocks_per_row: usize) -> (Vec<u8>, Vec<f32>) {
    let (mut bytes, mut want) = (Vec::new(), Vec::new());
    for k in 0..rows * blocks_per_row {
        let (b, w) = block(ty, k as u32);
        bytes.extend(b);
        want.extend(w);
    }
    (bytes, want)
}

fn block_size(ty: u32) -> usize {
    if matches!(ty, Q2_K | Q3_K | Q4_K | Q5_K | Q6_K) {
        256
    } else {
        32
    }
}

// ---------------------------------------------------------------------------------------------
// Decoding.

#[test]
fn plain_tensors_read_back_with_reversed_shape() {
    let vals: Vec<f32> = (0..6).map(|i| i as f32 * 0.5 - 1.0).collect();
    let f32_bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    let f16_bytes: Vec<u8> = vals.iter().flat_map(|&v| h(v)).collect();
    let bf16_bytes: Vec<u8> = vals.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect();
    let g = Writer::new()
        .tensor("a", &[3, 2], F32, &f32_bytes)
        .tensor("b", &[3, 2], F16, &f16_bytes)
        .tensor("c", &[3, 2], BF16, &bf16_bytes)
        .parse()
        .unwrap();
    assert_eq!(g.tensor_names().collect::<Vec<_>>(), ["a", "b", "c"]);
    for name in ["a", "b", "c"] {
        assert_eq!(
            g.tensor_info(name).unwrap().shape,
            [2, 3],
            "{name}: ne [3, 2] is row-major [2, 3]"
        );
        assert_eq!(g.dequantize(name).unwrap(), vals, "{name}");
    }
    // Stored dtype asked for: a view of the bytes, not a conversion.
    let t = g.dequantize_as("b", DType::F16).unwrap();
    assert_eq!(
        (t.dtype, t.shape.as_slice(), t.bytes()),
        (DType::F16, &[2, 3][..], &f16_bytes[..])
    );
    let t = g.dequantize_as("a", DType::BF16).unwrap();
    assert_eq!(t.bytes(), &bf16_bytes[..]);
    assert!(format!("{:#}", g.dequantize_as("a", DType::U32).unwrap_err()).contains("not uint32"));
}

#[test]
fn every_quantized_type_decodes_to_its_constructed_values() {
    for ty in [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K] {
        let per_row = if block_size(ty) == 32 { 3 } else { 1 };
        let (bytes, want) = matrix(ty, 2, per_row);
        let cols = per_row * block_size(ty);
        let g = Writer::new()
            .tensor("w", &[cols as u64, 2], ty, &bytes)
            .parse()
            .unwrap();
        assert_eq!(g.tensor_info("w").unwrap().shape, [2, cols]);
        let got = g.dequantize("w").unwrap();
        assert_eq!(got.len(), want.len());
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "type {ty} element {i}: {a} vs {b}");
        }
        let bf = g.dequantize_as("w", DType::BF16).unwrap().to_f32_vec();
        assert!(bf.iter().zip(&want).all(|(a, b)| *a == bf16::from_f32(*b).to_f32()));
    }
}

#[test]
fn undecodable_type_is_a_named_error_at_decode_time() {
    // IQ2_XXS: 66-byte blocks of 256. Its size is known, so the file opens.
    let g = Writer::new().tensor("iq", &[256], IQ2_XXS, &[0u8; 66]).parse().unwrap();
    let msg = format!("{:#}", g.dequantize("iq").unwrap_err());
    assert!(
        msg.contains("unsupported GGUF tensor type IQ2_XXS (16) for tensor \"iq\""),
        "{msg}"
    );
    let msg = format!("{:#}", g.to_mlx_affine("iq", DType::F16).unwrap_err());
    assert!(msg.contains("no exact MLX affine form"), "{msg}");
}

// ---------------------------------------------------------------------------------------------
// The gguf-py fixture (tests/fixtures/gguf/make_fixture.py).

fn fixture() -> GgufFile {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/quants.gguf");
    GgufFile::open(&path).unwrap()
}

const FIXTURE_TYPES: [&str; 12] = [
    "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
];

#[test]
fn dequantization_matches_gguf_py() {
    let g = fixture();
    let mut cases: Vec<(String, String)> = FIXTURE_TYPES
        .iter()
        .map(|t| (format!("w.{t}"), format!("expected.{t}")))
        .collect();
    cases.push(("w3d.Q8_0".into(), "expected3d.Q8_0".into()));
    for (w, expected) in cases {
        let (got, want) = (g.dequantize(&w).unwrap(), g.dequantize(&expected).unwrap());
        assert_eq!(
            g.tensor_info(&w).unwrap().shape,
            g.tensor_info(&expected).unwrap().shape
        );
        assert_eq!(got.len(), want.len(), "{w}");
        // ggml's float evaluation order is followed, so agreement is bitwise (well inside the
        // 1e-6 relative a regenerated fixture would need).
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(a.to_bits() == b.to_bits(), "{w}[{i}]: {a} vs gguf-py {b}");
        }
    }
    assert_eq!(
        g.tensor_info("w3d.Q8_0").unwrap().shape,
        [2, 3, 64],
        "numpy (2, 3, 64) is ne [64, 3, 2]"
    );
    assert_eq!(g.tensor_info("w.Q4_K").unwrap().shape, [4, 256]);
}

#[test]
fn metadata_written_by_gguf_py_reads_back() {
    let g = fixture();
    assert_eq!(g.version, 3);
    assert_eq!(g.alignment, 32);
    assert_eq!(g.get_str("general.architecture").unwrap(), "fixture");
    let want = [
        ("fixture.u8", MetaValue::U8(200)),
        ("fixture.i8", MetaValue::I8(-100)),
        ("fixture.u16", MetaValue::U16(60000)),
        ("fixture.i16", MetaValue::I16(-30000)),
        ("fixture.u32", MetaValue::U32(4_000_000_000)),
        ("fixture.i32", MetaValue::I32(-2_000_000_000)),
        ("fixture.f32", MetaValue::F32(1.5)),
        ("fixture.u64", MetaValue::U64((1 << 63) + 5)),
        ("fixture.i64", MetaValue::I64(-(1 << 62))),
        ("fixture.f64", MetaValue::F64(-2.25)),
        ("fixture.bool", MetaValue::Bool(true)),
        ("fixture.string", MetaValue::String("héllo".into())),
        (
            "fixture.ints",
            MetaValue::Array(
                MetaType::I32,
                vec![MetaValue::I32(1), MetaValue::I32(-2), MetaValue::I32(3)],
            ),
        ),
        (
            "fixture.strings",
            MetaValue::Array(
                MetaType::String,
                vec![MetaValue::String("a".into()), MetaValue::String("bc".into())],
            ),
        ),
        (
            "fixture.nested",
            MetaValue::Array(
                MetaType::Array,
                vec![
                    MetaValue::Array(MetaType::I32, vec![MetaValue::I32(1), MetaValue::I32(2)]),
                    MetaValue::Array(MetaType::I32, vec![MetaValue::I32(3)]),
                ],
            ),
        ),
    ];
    for (key, v) in want {
        assert_eq!(g.get(key), Some(&v), "{key}");
    }
    assert_eq!(g.get_u64("fixture.u8").unwrap(), 200);
    assert_eq!(g.get_f32("fixture.f64").unwrap(), -2.25);
    assert!(g.get_bool("fixture.bool").unwrap());
    assert_eq!(g.get_array("fixture.strings").unwrap().len(), 2);
}

// ---------------------------------------------------------------------------------------------
// MLX affine mapping.

/// Dequantizes an MLX affine tensor the way the kernels read it: q · scale + bias, in f32.
fn mlx_dequantize(a: &MlxAffine) -> Vec<f32> {
    let words = *a.weight.shape.last().unwrap();
    let groups = *a.scales.shape.last().unwrap();
    let cols = words * 32 / a.bits as usize;
    let packed = a.weight.to_vec::<u32>().unwrap();
    let (scales, biases) = (a.scales.to_f32_vec(), a.biases.to_f32_vec());
    let rows = packed.len() / words;
    assert_eq!(groups, cols / a.group_size);
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        let row = &packed[r * words..(r + 1) * words];
        for j in 0..cols {
            let g = r * groups + j / a.group_size;
            out.push(unpack(row, j, a.bits) as f32 * scales[g] + biases[g]);
        }
    }
    out
}

fn assert_affine_exact(g: &GgufFile, name: &str, dtype: DType, bits: u32) {
    let a = g.to_mlx_affine(name, dtype).unwrap();
    let shape = &g.tensor_info(name).unwrap().shape;
    let (cols, outer) = shape.split_last().unwrap();
    assert_eq!((a.bits, a.group_size), (bits, 32), "{name}");
    assert_eq!(a.weight.dtype, DType::U32);
    assert_eq!(a.weight.shape, [outer, &[cols * bits as usize / 32]].concat(), "{name}");
    assert_eq!(a.scales.shape, [outer, &[cols / 32]].concat(), "{name}");
    assert_eq!((a.scales.dtype, a.biases.dtype), (dtype, dtype));
    let direct = g.dequantize(name).unwrap();
    let mapped = mlx_dequantize(&a);
    assert_eq!(direct.len(), mapped.len());
    for (i, (a, b)) in direct.iter().zip(&mapped).enumerate() {
        assert!(a == b, "{name} as {dtype}, element {i}: direct {a} vs affine {b}");
    }
}

#[test]
fn affine_mapping_is_exact_for_q4_0_q4_1_q8_0_in_f16() {
    let g = fixture();
    for (ty, bits) in [("Q4_0", 4), ("Q4_1", 4), ("Q8_0", 8), ("Q5_0", 8), ("Q5_1", 8)] {
        assert_affine_exact(&g, &format!("w.{ty}"), DType::F16, bits);
        assert_affine_exact(&g, &format!("w.{ty}"), DType::F32, bits);
    }
    assert_affine_exact(&g, "w3d.Q8_0", DType::F16, 8);
    for ty in [Q4_0, Q4_1, Q8_0, Q5_0, Q5_1] {
        let (bytes, _) = matrix(ty, 3, 2);
        let g = Writer::new().tensor("w", &[64, 3], ty, &bytes).parse().unwrap();
        let bits = if matches!(ty, Q4_0 | Q4_1) { 4 } else { 8 };
        assert_affine_exact(&g, "w", DType::F16, bits);
        assert_affine_exact(&g, "w", DType::BF16, bits);
    }
}

#[test]
fn affine_mapping_of_q4_k_q5_k_is_exact_in_f32_and_refuses_to_round() {
    let g = fixture();
    assert_affine_exact(&g, "w.Q4_K", DType::F32, 4);
    assert_affine_exact(&g, "w.Q5_K", DType::F32, 8);
    let msg = format!("{:#}", g.to_mlx_affine("w.Q4_K", DType::F16).unwrap_err());
    assert!(
        msg.contains("not exact in float16") && msg.contains("ask for float32"),
        "{msg}"
    );
    for name in ["w.Q6_K", "w.Q2_K", "w.Q3_K", "w.F16"] {
        let msg = format!("{:#}", g.to_mlx_affine(name, DType::F16).unwrap_err());
        assert!(msg.contains("no exact MLX affine form"), "{msg}");
    }
}

#[test]
fn q4_0_repacks_ggml_nibble_order_into_mlx_order() {
    // qs[i] = (15 − i) << 4 | i: elements 0..16 are 0..15 and elements 16..32 count back down;
    // MLX's word w holds elements 8w..8w + 8, lowest nibble first.
    let mut b = h(1.0).to_vec();
    b.extend((0..16u8).map(|i| i | (15 - i) << 4));
    let g = Writer::new().tensor("w", &[32], Q4_0, &b).parse().unwrap();
    let a = g.to_mlx_affine("w", DType::F16).unwrap();
    let packed = a.weight.to_vec::<u32>().unwrap();
    let q: Vec<u32> = (0..32).map(|j| unpack(&packed, j, 4)).collect();
    let want: Vec<u32> = (0..16).chain((0..16).rev()).collect();
    assert_eq!(q, want);
    assert_eq!(packed[0], 0x7654_3210);
    assert_eq!(a.biases.to_f32_vec(), [-8.0]);
}

#[test]
fn affine_scale_overflowing_f16_is_an_error() {
    // d = 1024: −128·d = −131072 does not fit f16, so Q8_0 → f16 refuses; f32 is fine.
    let mut b = h(1024.0).to_vec();
    b.extend([1u8; 32]);
    let g = Writer::new().tensor("w", &[32], Q8_0, &b).parse().unwrap();
    let msg = format!("{:#}", g.to_mlx_affine("w", DType::F16).unwrap_err());
    assert!(
        msg.contains("bias of group 0") && msg.contains("not exact in float16"),
        "{msg}"
    );
    assert_affine_exact(&g, "w", DType::F32, 8);
    // A non-finite scale has no exact form in any dtype.
    let mut b = h(f32::INFINITY).to_vec();
    b.extend([1u8; 32]);
    let g = Writer::new().tensor("w", &[32], Q8_0, &b).parse().unwrap();
    let msg = format!("{:#}", g.to_mlx_affine("w", DType::F32).unwrap_err());
    assert!(msg.contains("non-finite"), "{msg}");
}

// ---------------------------------------------------------------------------------------------
// Metadata.

fn every_value_type() -> Vec<(&'static str, MetaValue)> {
    vec![
        ("u8", MetaValue::U8(255)),
        ("i8", MetaValue::I8(i8::MIN)),
        ("u16", MetaValue::U16(u16::MAX)),
        ("i16", MetaValue::I16(i16::MIN)),
        ("u32", MetaValue::U32(u32::MAX)),
        ("i32", MetaValue::I32(i32::MIN)),
        ("f32", MetaValue::F32(-0.15625)),
        ("bool.t", MetaValue::Bool(true)),
        ("bool.f", MetaValue::Bool(false)),
        ("string", MetaValue::String("héllo\0 wörld".into())),
        ("string.empty", MetaValue::String(String::new())),
        ("u64", MetaValue::U64(u64::MAX)),
        ("i64", MetaValue::I64(i64::MIN)),
        ("f64", MetaValue::F64(1e300)),
        ("array.empty", MetaValue::Array(MetaType::F64, vec![])),
        (
            "array.u8",
            MetaValue::Array(MetaType::U8, vec![MetaValue::U8(1), MetaValue::U8(2)]),
        ),
        (
            "array.string",
            MetaValue::Array(
                MetaType::String,
                vec![MetaValue::String("<s>".into()), MetaValue::String("".into())],
            ),
        ),
        (
            "array.nested",
            MetaValue::Array(
                MetaType::Array,
                vec![
                    MetaValue::Array(MetaType::Bool, vec![MetaValue::Bool(true)]),
                    MetaValue::Array(
                        MetaType::Array,
                        vec![MetaValue::Array(MetaType::I64, vec![MetaValue::I64(-1)])],
                    ),
                    MetaValue::Array(MetaType::U16, vec![]),
                ],
            ),
        ),
    ]
}

#[test]
fn metadata_of_every_value_type_round_trips() {
    let mut w = Writer::new();
    let mut want = BTreeMap::new();
    for (k, v) in every_value_type() {
        w = w.kv(k, v.clone());
        want.insert(k.to_string(), v);
    }
    let g = w.parse().unwrap();
    assert_eq!(g.metadata, want);
    assert_eq!(g.tensor_names().count(), 0);
}

#[test]
fn invalid_utf8_strings_decode_lossily() {
    let g = Writer::new()
        .raw_kv(
            &[
                &[1, 0, 0, 0, 0, 0, 0, 0, b'k', 8, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0][..],
                &[b'a', 0xff],
            ]
            .concat(),
        )
        .parse()
        .unwrap();
    assert_eq!(g.get_str("k").unwrap(), "a\u{fffd}");
}

#[test]
fn accessors_name_the_missing_key_or_the_wrong_type() {
    let g = Writer::new()
        .kv("n", MetaValue::U32(7))
        .kv("neg", MetaValue::I32(-1))
        .kv("s", MetaValue::String("x".into()))
        .parse()
        .unwrap();
    let e = |r: anyhow::Result<()>| format!("{:#}", r.unwrap_err());
    assert_eq!(g.get_u64("n").unwrap(), 7);
    assert!(e(g.get_str("nope").map(|_| ())).contains("<memory>: metadata key \"nope\" is missing"));
    assert!(e(g.get_str("n").map(|_| ())).contains("\"n\" is a uint32, expected a string"));
    assert!(e(g.get_u64("neg").map(|_| ())).contains("is an int32, expected a non-negative integer"));
    assert!(e(g.get_f32("s").map(|_| ())).contains("is a string, expected a float"));
    assert!(e(g.get_array("s").map(|_| ())).contains("expected an array"));
    assert!(e(g.get_bool("n").map(|_| ())).contains("expected a bool"));
    assert!(e(g.tensor_info("t").map(|_| ())).contains("no tensor \"t\""));
}

#[test]
fn open_names_the_file_in_errors() {
    let g = fixture();
    assert!(g.source.ends_with("quants.gguf"));
    assert!(format!("{:#}", g.dequantize("missing").unwrap_err()).contains("quants.gguf: no tensor"));
    let bad = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/make_fixture.py");
    let msg = format!("{:#}", GgufFile::open(&bad).unwrap_err());
    assert!(msg.contains("make_fixture.py: invalid GGUF file: bad magic"), "{msg}");
    assert!(format!("{:#}", GgufFile::open(&bad.with_extension("nope")).unwrap_err()).contains("opening"));
}

// ---------------------------------------------------------------------------------------------
// Hostile and broken files.

fn small_valid_file() -> Writer {
    let (q, _) = block(Q4_0, 1);
    Writer::new()
        .kv("general.architecture", MetaValue::String("llama".into()))
        .kv(
            "a",
            MetaValue::Array(
                MetaType::Array,
                vec![MetaValue::Array(MetaType::U8, vec![MetaValue::U8(3)])],
            ),
        )
        .kv("f", MetaValue::F32(0.5))
        .tensor("t.f32", &[2], F32, &[0, 0, 128, 63, 0, 0, 0, 64])
        .tensor("t.q4", &[32], Q4_0, &q)
}

#[test]
fn every_truncation_of_a_valid_file_is_an_error() {
    let bytes = small_valid_file().bytes();
    let g = GgufFile::parse(&bytes).unwrap();
    assert_eq!(g.dequantize("t.f32").unwrap(), [1.0, 2.0]);
    for len in 0..bytes.len() {
        let msg = err_of(GgufFile::parse(&bytes[..len]));
        assert!(msg.starts_with("<memory>: invalid GGUF file: "), "prefix {len}: {msg}");
        assert!(
            msg.contains("truncated") || msg.contains("past the end"),
            "prefix {len}: {msg}"
        );
    }
}

#[test]
fn every_single_byte_corruption_is_handled_without_panicking() {
    let bytes = small_valid_file().bytes();
    for i in 0..bytes.len() {
        for v in [0x00, 0x01, 0x7f, 0x80, 0xff] {
            let mut b = bytes.clone();
            b[i] = v;
            if let Ok(g) = GgufFile::parse(&b) {
                for name in g.tensor_names() {
                    let _ = g.dequantize(name);
                    let _ = g.to_mlx_affine(name, DType::F16);
                }
            }
        }
    }
}

fn header(n_tensors: u64, n_kv: u64) -> Vec<u8> {
    [
        &b"GGUF"[..],
        &3u32.to_le_bytes(),
        &n_tensors.to_le_bytes(),
        &n_kv.to_le_bytes(),
    ]
    .concat()
}

#[test]
fn bad_magic_and_versions_are_named() {
    let mut w = small_valid_file();
    w.magic = *b"GGML";
    assert_err(w.parse(), "bad magic");
    for (version, needle) in [
        (1, "version 1"),
        (4, "unsupported GGUF version 4"),
        (3 << 24, "big-endian"),
    ] {
        let mut w = small_valid_file();
        w.version = version;
        assert_err(w.parse(), needle);
    }
    let mut w = small_valid_file();
    w.version = 2;
    assert_eq!(w.parse().unwrap().version, 2);
    assert_eq!(GgufFile::parse(&header(0, 0)).unwrap().tensors().len(), 0);
}

#[test]
fn huge_claimed_counts_and_lengths_fail_before_allocating() {
    assert_err(GgufFile::parse(&header(u64::MAX, 0)), "the tensor count claims");
    assert_err(GgufFile::parse(&header(0, u64::MAX)), "the metadata count claims");
    assert_err(GgufFile::parse(&header(1 << 40, 0)), "the tensor count claims");
    // A key whose length is the whole address space.
    let key = [header(0, 1), u64::MAX.to_le_bytes().to_vec(), vec![0; 16]].concat();
    assert_err(GgufFile::parse(&key), "claims 18446744073709551615 bytes");
    // A string value, and an array of u32, each claiming far more than the file holds.
    let string = [
        &[1, 0, 0, 0, 0, 0, 0, 0, b'k', 8, 0, 0, 0][..],
        &(1u64 << 62).to_le_bytes(),
    ]
    .concat();
    assert_err(
        Writer::new().raw_kv(&string).parse(),
        "claims 4611686018427387904 bytes",
    );
    let array = [
        &[1, 0, 0, 0, 0, 0, 0, 0, b'k', 9, 0, 0, 0, 4, 0, 0, 0][..],
        &(1u64 << 61).to_le_bytes(),
    ]
    .concat();
    assert_err(
        Writer::new().raw_kv(&array).parse(),
        "an array of uint32 claims 2305843009213693952 entries",
    );
    // A tensor name length past the end.
    let mut w = Writer::new();
    w.infos.extend(u64::MAX.to_le_bytes());
    w.infos.extend([0; 16]);
    w.n_tensors = 1;
    assert_err(w.parse(), "a tensor name");
    // Dimensions whose product overflows.
    let w = Writer::new().info("t", &[1 << 32, 1 << 32, 1 << 32], F32, 0);
    assert_err(w.parse(), "overflows");
    let w = Writer::new().info("t", &[u64::MAX], F32, 0);
    assert_err(w.parse(), "int64");
}

#[test]
fn deeply_nested_arrays_are_refused() {
    let mut kv = vec![1, 0, 0, 0, 0, 0, 0, 0, b'k', 9, 0, 0, 0];
    for _ in 0..20 {
        kv.extend(9u32.to_le_bytes());
        kv.extend(1u64.to_le_bytes());
    }
    kv.extend([0; 16]);
    assert_err(Writer::new().raw_kv(&kv).parse(), "nested more than 8 deep");
}

#[test]
fn tensor_data_out_of_bounds_or_misaligned_is_an_error() {
    // Offset past the end of the file.
    let w = small_valid_file().info("far", &[4], F32, 1 << 20);
    assert_err(w.parse(), "tensor \"far\": its 16 bytes at data offset 1048576");
    let w = small_valid_file().info("far", &[4], F32, u64::MAX - 31);
    assert_err(w.parse(), "run past the end");
    // Claims more elements than the data holds.
    let w = Writer::new().tensor("big", &[1024], F32, &[0; 16]);
    assert_err(w.parse(), "run past the end");
    // Misaligned offset.
    let w = Writer::new().tensor("a", &[8], F32, &[0; 32]).info("b", &[4], F32, 4);
    assert_err(
        w.parse(),
        "tensor \"b\": data offset 4 is not a multiple of the alignment 32",
    );
    // A data section that does not start at an aligned offset (the padding left out).
    let w = Writer::new().tensor("a", &[8], F32, &[0; 32]);
    let header_len = 24 + w.kvs.len() + w.infos.len();
    let mut bytes = w.bytes();
    assert!(!header_len.is_multiple_of(32));
    bytes.drain(header_len..header_len.next_multiple_of(32));
    assert_err(GgufFile::parse(&bytes), "tensor \"a\": its 32 bytes at data offset 0");
}

#[test]
fn alignment_comes_from_general_alignment() {
    let w = Writer::new()
        .kv("general.alignment", MetaValue::U32(64))
        .tensor("a", &[3], F32, &[0; 12])
        .tensor("b", &[2], F32, &[0, 0, 128, 63, 0, 0, 0, 64]);
    let g = w.parse().unwrap();
    assert_eq!(g.alignment, 64);
    assert!(g.data_start.is_multiple_of(64));
    assert_eq!(g.tensor_info("b").unwrap().offset, 64);
    assert_eq!(g.dequantize("b").unwrap(), [1.0, 2.0]);
    let mut w = Writer::new().kv("general.alignment", MetaValue::U32(24));
    w.alignment = 8;
    assert_err(w.parse(), "general.alignment is 24, not a power of two");
    let mut w = Writer::new().kv("general.alignment", MetaValue::U32(0));
    w.alignment = 8;
    assert_err(w.parse(), "not a power of two");
    let w = Writer::new().kv("general.alignment", MetaValue::String("32".into()));
    assert_err(w.parse(), "general.alignment is a string");
}

#[test]
fn malformed_tensor_infos_and_values_are_named() {
    assert_err(
        Writer::new().info("t", &[32], 99, 0).parse(),
        "unsupported GGUF tensor type 99 for tensor \"t\"",
    );
    assert_err(
        Writer::new().info("t", &[1, 1, 1, 1, 1], F32, 0).parse(),
        "5 dimensions",
    );
    assert_err(
        Writer::new().tensor("t", &[16], Q4_0, &[0; 9]).parse(),
        "row length 16 is not a multiple",
    );
    let w = Writer::new()
        .tensor("t", &[1], F32, &[0; 4])
        .tensor("t", &[1], F32, &[0; 4]);
    assert_err(w.parse(), "tensor \"t\" appears twice");
    let w = Writer::new().kv("k", MetaValue::U8(1)).kv("k", MetaValue::U8(2));
    assert_err(w.parse(), "metadata key \"k\" appears twice");
    let bad_bool = [1, 0, 0, 0, 0, 0, 0, 0, b'k', 7, 0, 0, 0, 2];
    assert_err(Writer::new().raw_kv(&bad_bool).parse(), "bool at byte");
    let bad_type = [1, 0, 0, 0, 0, 0, 0, 0, b'k', 13, 0, 0, 0, 0, 0, 0, 0];
    assert_err(
        Writer::new().raw_kv(&bad_type).parse(),
        "unknown metadata value type 13",
    );
    // Zero-sized tensors are fine.
    let g = Writer::new().tensor("empty", &[0, 3], Q4_0, &[]).parse().unwrap();
    assert_eq!(g.dequantize("empty").unwrap(), Vec::<f32>::new());
    assert_eq!(g.to_mlx_affine("empty", DType::F16).unwrap().weight.shape, [3, 0]);
}

#[test]
fn head_counts_that_cannot_make_attention_are_named_errors() {
    let dir = std::env::temp_dir().join(format!("mlxcel-gguf-heads-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (heads, kv_heads) in [(0u32, 0u32), (4, 0), (4, 3)] {
        let file = Writer::new()
            .kv("general.architecture", MetaValue::String("llama".into()))
            .kv("llama.attention.head_count", MetaValue::U32(heads))
            .kv("llama.attention.head_count_kv", MetaValue::U32(kv_heads))
            .kv("llama.embedding_length", MetaValue::U32(8))
            .tensor("token_embd.weight", &[8, 4], F32, &[0u8; 128]);
        let path = dir.join(format!("h{heads}-{kv_heads}.gguf"));
        std::fs::write(&path, file.bytes()).unwrap();
        let e = match mlxcel_models::from_gguf::read(&path, &mut |_, _| {}) {
            Ok(_) => panic!("{heads}/{kv_heads} heads read"),
            Err(e) => format!("{e:#}"),
        };
        assert!(
            e.contains(&format!("{heads} attention heads")) && e.contains(&format!("share {kv_heads} key/value")),
            "{e}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}
