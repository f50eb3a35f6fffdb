#!/usr/bin/env python3
"""The NF4 reference for QLoRA from a Hugging Face directory (test_qlora_hf_import).

Quantizes the linear weights of the tiny Hugging Face models in tests/fixtures/hf/
{llama,qwen2,qwen3,qwen3_moe,mixtral,qwen2_moe} (q/k/v/o_proj and gate/up/down_proj of
every layer, every expert's and the shared expert's, mixtral's w1/w3/w2: what
`--quantize-base nf4` quantizes; the routers and the shared expert's gate stay fp32) with bitsandbytes' published NF4 algorithm, written
here from its description, not from shardlm's code:

- the tensor, flattened row-major, is cut into blocks of 64 values; a block's absmax
  is max |x| in fp32 (bitsandbytes' default blocksize for 4-bit, no double quantization);
- each value is scaled to s = x / absmax in fp32 and given the code that bitsandbytes'
  decision tree `dQuantizeNF4` (csrc/kernels.cu) returns: the number of its 15
  thresholds (fp32 literals, the midpoints of the 16 NormalFloat codes of the QLoRA
  paper) that s is strictly greater than; a block of zeros gets code 7 (0.0);
- two codes per byte, the earlier value in the high nibble (bitsandbytes' packing).

bitsandbytes' CUDA kernel multiplies by 1 / absmax where its pure-torch path divides;
the script computes both and checks that they give the same codes on these fixtures,
so the reference does not depend on that choice. It also reports how many scaled
values fall exactly on a threshold (where the tie rule decides).

Writes tests/fixtures/hf/nf4_reference.safetensors: per model and tensor,
"<model>/<hf name>.absmax" (F32, one per block) and "<model>/<hf name>.codes" (U8,
ceil(n / 2) bytes). Run with the tools venv: /work/venv/bin/python tools/make_nf4_reference.py
"""
import json
import os

import numpy as np
from safetensors.numpy import save_file
from safetensors.torch import load_file  # the llama fixture is stored in bf16

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "hf")
BLOCK = 64
# csrc/kernels.cu dQuantizeNF4's thresholds, low to high (fp32 literals).
THRESHOLDS = np.array([
    -0.8480964004993439, -0.6106329262256622, -0.4599952697753906, -0.33967943489551544,
    -0.23460740596055984, -0.13791173323988914, -0.045525018125772476, 0.03979014977812767,
    0.1202552504837513, 0.2035212516784668, 0.2920137718319893, 0.3893125355243683,
    0.5016634166240692, 0.6427869200706482, 0.8614784181118011,
], dtype=np.float32)
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
          "w1", "w3", "w2")  # mixtral's experts


def codes_of(scaled):
    # count of thresholds strictly below s (the decision tree's `s > t` at every level)
    return (scaled[:, None] > THRESHOLDS[None, :]).sum(axis=1).astype(np.uint8)


def quantize(x):
    x = x.astype(np.float32).reshape(-1)
    n = x.size
    blocks = (n + BLOCK - 1) // BLOCK
    absmax = np.zeros(blocks, dtype=np.float32)
    codes = np.full(n, 7, dtype=np.uint8)
    ties = 0
    for b in range(blocks):
        v = x[b * BLOCK:(b + 1) * BLOCK]
        a = np.float32(np.max(np.abs(v)))
        absmax[b] = a
        if a == 0:
            continue
        divided = (v / a).astype(np.float32)
        multiplied = (v * (np.float32(1) / a)).astype(np.float32)
        c = codes_of(divided)
        assert np.array_equal(c, codes_of(multiplied)), "x / absmax and x * (1 / absmax) disagree"
        ties += int(np.isin(divided, THRESHOLDS).sum())
        codes[b * BLOCK:(b + 1) * BLOCK] = c
    if n % 2:
        codes = np.append(codes, np.uint8(0))
    packed = ((codes[0::2] << 4) | codes[1::2]).astype(np.uint8)
    return absmax, packed, ties


def model_tensors(directory):
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        tensors = {}
        for shard in sorted(set(json.load(open(index))["weight_map"].values())):
            tensors.update(load_file(os.path.join(directory, shard)))
    else:
        tensors = load_file(os.path.join(directory, "model.safetensors"))
    # bf16 and fp16 widen to fp32 exactly, as shardlm's import reads them
    return {name: t.float().numpy() for name, t in tensors.items()}


def main():
    out = {}
    for model in ("llama", "qwen2", "qwen3", "qwen3_moe", "mixtral", "qwen2_moe"):
        total = ties = 0
        for name, value in sorted(model_tensors(os.path.join(ROOT, model)).items()):
            if not (name.endswith(".weight") and any(f".{m}." in name for m in LINEAR)):
                continue
            absmax, packed, t = quantize(value)
            out[f"{model}/{name}.absmax"] = absmax
            out[f"{model}/{name}.codes"] = packed
            total += value.size
            ties += t
        print(f"{model}: {total} values quantized, {ties} exactly on a threshold")
    path = os.path.join(ROOT, "nf4_reference.safetensors")
    save_file(out, path, metadata={"generator": "tools/make_nf4_reference.py"})
    print(f"wrote {path} ({len(out)} tensors)")


if __name__ == "__main__":
    main()
