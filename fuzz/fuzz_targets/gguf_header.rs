//! Arbitrary bytes as a GGUF file: parsing must never panic, and whatever parses must decode
//! (or refuse to, with an error) without panicking either.

#![no_main]

use libfuzzer_sys::fuzz_target;
use mlxcel_core::DType;
use mlxcel_models::gguf::GgufFile;

/// Tensors larger than this are skipped so one input cannot stall the run.
const MAX_ELEMENTS: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let Ok(g) = GgufFile::parse(data) else { return };
    for t in g.tensors() {
        if t.numel() > MAX_ELEMENTS {
            continue;
        }
        if let Ok(values) = g.dequantize(&t.name) {
            assert_eq!(values.len(), t.numel());
        }
        let _ = g.dequantize_as(&t.name, DType::BF16);
        let _ = g.to_mlx_affine(&t.name, DType::F16);
        let _ = g.to_mlx_affine(&t.name, DType::F32);
    }
    for key in g.metadata.keys() {
        let _ = (g.get_str(key), g.get_u64(key), g.get_f32(key), g.get_array(key));
    }
});
