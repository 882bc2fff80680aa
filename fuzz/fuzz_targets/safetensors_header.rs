//! Arbitrary bytes as a safetensors file, through the same steps as
//! `mlxcel_models::checkpoint::Checkpoint::open_files` (which only takes paths): the
//! `safetensors` header reader, then the checkpoint's own offset arithmetic and view.

#![no_main]

use libfuzzer_sys::fuzz_target;
use mlxcel_core::tensor::Storage;
use mlxcel_core::{DType, HostTensor};

fn dtype_of(d: safetensors::Dtype) -> Option<DType> {
    Some(match d {
        safetensors::Dtype::F32 => DType::F32,
        safetensors::Dtype::F16 => DType::F16,
        safetensors::Dtype::BF16 => DType::BF16,
        safetensors::Dtype::U32 => DType::U32,
        safetensors::Dtype::I32 => DType::I32,
        safetensors::Dtype::U8 => DType::U8,
        safetensors::Dtype::BOOL => DType::Bool,
        _ => return None,
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok((header_len, meta)) = safetensors::SafeTensors::read_metadata(data) else {
        return;
    };
    // As checkpoint.rs: the data section follows the 8-byte length and the header.
    let data_start = 8 + header_len;
    let data_len = data.len() - data_start;
    let storage = Storage::from_vec(data.to_vec());
    for (_name, info) in meta.tensors() {
        let Some(dtype) = dtype_of(info.dtype) else { continue };
        let (start, end) = info.data_offsets;
        let elems = info.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let want = elems.and_then(|n| n.checked_mul(dtype.size()));
        if !(start <= end && end <= data_len && want == Some(end - start)) {
            continue;
        }
        let view = storage.slice(data_start + start, end - start).expect("checked range");
        let t = HostTensor::from_bytes(dtype, info.shape.clone(), view).expect("checked size");
        if t.numel() <= 1 << 20 {
            let _ = t.to_f64_vec();
        }
    }
});
