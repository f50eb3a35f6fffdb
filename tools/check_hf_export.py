#!/usr/bin/env python3
"""Loads a `shardlm export` directory with Hugging Face transformers
(AutoModelForCausalLM: GPT-2, Llama, Qwen2, Qwen3), fails if any weight is missing,
unexpected or mismatched, and prints the mean cross-entropy on the first windows of a
shardlm token file, as `shardlm eval` computes it (windows of seq_len+1 tokens
starting at multiples of seq_len). Exit status 77 (and a message) when torch or
transformers is missing. Run with any python that has them (Debian's python3-torch, or
the PyPI venv: the tests take $SHARDLM_REF_PYTHON).

usage: check_hf_export.py EXPORT_DIR TOKEN_FILE SEQ_LEN WINDOWS
"""
import struct
import sys

try:
    import torch
    from transformers import AutoModelForCausalLM
except ImportError as error:  # the test skips with this message
    print(f"skipped: Python packages missing ({error}); install python3-torch and transformers")
    sys.exit(77)


def read_tokens(path):
    data = open(path, "rb").read()
    # docs/data-format.md: magic, version u32, bytes per token u32, vocab u64, count u64
    magic, version, token_bytes, vocab, count = struct.unpack_from("<8sIIQQ", data, 0)
    if not magic.startswith(b"SHLMTOK"):
        sys.exit(f"{path}: not a shardlm token file")
    dtype = {2: "H", 4: "I"}[token_bytes]
    return list(struct.unpack_from(f"<{count}{dtype}", data, 64))


def main():
    export_dir, token_file, seq_len, windows = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    tokens = read_tokens(token_file)
    model, info = AutoModelForCausalLM.from_pretrained(export_dir, torch_dtype=torch.float32,
                                                       output_loading_info=True)
    problems = {k: v for k, v in info.items() if v and k != "error_msgs"}
    if problems or info.get("error_msgs"):
        sys.exit(f"transformers loaded {export_dir} with problems: {info}")
    model = model.float().eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for w in range(windows):
            window = torch.tensor(tokens[w * seq_len: w * seq_len + seq_len + 1]).unsqueeze(0)
            logits = model(window[:, :-1]).logits.double()
            loss = torch.nn.functional.cross_entropy(logits[0], window[0, 1:], reduction="sum")
            total += loss.item()
            count += seq_len
    print(f"loss: {total / count:.8f}")


if __name__ == "__main__":
    main()
