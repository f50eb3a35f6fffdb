#!/usr/bin/env python3
"""Loads a `shardlm export` PEFT adapter directory onto its base model with PyPI peft
(PeftModel.from_pretrained), fails if any adapter weight is missing or unexpected, and
prints the mean cross-entropy on the first windows of a shardlm token file, as
`shardlm eval` computes it (see check_hf_export.py). Exit status 77 when torch,
transformers or peft is missing.

usage: check_peft_export.py BASE_DIR ADAPTER_DIR TOKEN_FILE SEQ_LEN WINDOWS
"""
import sys

try:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
except ImportError as error:
    print(f"skipped: Python packages missing ({error}); install torch, transformers and peft")
    sys.exit(77)

from check_hf_export import read_tokens


def main():
    base_dir, adapter_dir, token_file = sys.argv[1], sys.argv[2], sys.argv[3]
    seq_len, windows = int(sys.argv[4]), int(sys.argv[5])
    base = AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter_dir).float().eval()
    loaded = [n for n, _ in model.named_parameters() if "lora_" in n]
    if not loaded:
        sys.exit(f"peft loaded no adapter weights from {adapter_dir}")
    tokens = read_tokens(token_file)
    total, count = 0.0, 0
    with torch.no_grad():
        for w in range(windows):
            window = torch.tensor(tokens[w * seq_len: w * seq_len + seq_len + 1]).unsqueeze(0)
            logits = model(input_ids=window[:, :-1]).logits.double()
            total += torch.nn.functional.cross_entropy(logits[0], window[0, 1:], reduction="sum").item()
            count += seq_len
    print(f"adapter tensors: {len(loaded)}")
    print(f"loss: {total / count:.8f}")


if __name__ == "__main__":
    main()
