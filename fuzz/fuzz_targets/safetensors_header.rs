//! Arbitrary bytes as a safetensors file through the checkpoint loader itself
//! (`Checkpoint::from_bytes`: the `safetensors` header reader, then the checkpoint's own offset
//! checks), then every tensor it accepts read back.

#![no_main]

use libfuzzer_sys::fuzz_target;
use mlxcel_models::checkpoint::Checkpoint;

fuzz_target!(|data: &[u8]| {
    let Ok(ck) = Checkpoint::from_bytes(data.to_vec()) else { return };
    let names: Vec<String> = ck.names().map(str::to_string).collect();
    for name in names {
        let t = ck.get(&name).expect("a tensor the loader accepted reads back");
        if t.numel() <= 1 << 20 {
            let _ = t.to_f64_vec();
        }
    }
});
