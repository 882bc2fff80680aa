"""Writes small seed inputs for the fuzz targets into seeds/ (gguf-py and numpy needed):
one GGUF file with a tensor of every type mlxcel decodes, and a safetensors file."""

import json
import struct

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

rng = np.random.default_rng(1)
w = gguf.GGUFWriter("seeds/gguf_header/small.gguf", arch="seed")
w.add_uint32("seed.u32", 7)
w.add_float32("seed.f32", 0.5)
w.add_bool("seed.bool", True)
w.add_array("seed.tokens", ["a", "b"])
w.add_array("seed.nested", [[1], [2, 3]])
w.add_tensor("f32", rng.standard_normal(4).astype(np.float32))
w.add_tensor("f16", rng.standard_normal(4).astype(np.float16))
for qtype in [T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]:
    w.add_tensor(qtype.name, gguf.quants.quantize(rng.standard_normal(32).astype(np.float32), qtype), raw_dtype=qtype)
for qtype in [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]:
    w.add_tensor(qtype.name, rng.integers(0, 256, size=GGML_QUANT_SIZES[qtype][1], dtype=np.uint8), raw_dtype=qtype)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()

header = {
    "__metadata__": {"format": "pt"},
    "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
    "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]},
}
text = json.dumps(header).encode()
with open("seeds/safetensors_header/small.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + bytes(range(22)))
