#!/usr/bin/env python3
"""End-to-end check of issue 23's template item: a tiny Qwen3-shaped model made with
transformers, with the real Qwen BPE (qwen.tiktoken through tools/tokenizer_dirs.py:
Qwen2.5's added tokens plus Qwen3's <think> tokens and Qwen3's published template),
LoRA-fine-tuned by `shardlm sft` on GSM8K with the directory's own template; the
export is then prompted by transformers' apply_chat_template. Checks, for the first
examples of RUN/data/train.sft, that the tokens before the first loss target are
exactly the prompt transformers serves (add_generation_prompt=True) and that the
targets are the answer the template renders after it, up to <|im_end|>.

Usage: /work/venv/bin/python tools/check_sft_served_prompt.py SHARDLM WORK_DIR [--enable-thinking false]
"""
import argparse
import json
import os
import struct
import subprocess
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_dirs as dirs  # noqa: E402


def read_sft(path):
    data = open(path, "rb").read()
    assert data[:8] == b"SHLMSFT\0"
    token_bytes, = struct.unpack_from("<I", data, 12)
    n, count = struct.unpack_from("<QQ", data, 24)
    offsets = struct.unpack_from(f"<{n + 1}Q", data, 64)
    at = 64 + 8 * (n + 1)
    tokens = struct.unpack_from(f"<{count}{'H' if token_bytes == 2 else 'I'}", data, at)
    mask = data[at + count * token_bytes: at + count * token_bytes + count]
    return [(list(tokens[offsets[e]:offsets[e + 1]]), list(mask[offsets[e]:offsets[e + 1]])) for e in range(n)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("shardlm")
    parser.add_argument("work")
    parser.add_argument("--data", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data"))
    parser.add_argument("--enable-thinking", default=None)
    parser.add_argument("--examples", type=int, default=64)
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)
    model_dir = os.path.join(args.work, "tiny-qwen3")
    built = dirs.build_all(args.data)
    tok_obj, config, fill, _, _ = built["qwen3"]
    dirs.write_dir(model_dir, dirs.tokenizer_json(tok_obj, fill), config)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=151669, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                         max_position_embeddings=512, tie_word_embeddings=True,
                                         bos_token_id=151643, eos_token_id=151645))
    model.save_pretrained(model_dir)
    lines = open(os.path.join(args.data, "sft", "gsm8k_train.jsonl"), encoding="utf-8").read().splitlines()[:args.examples]
    dataset = os.path.join(args.work, "gsm8k_head.jsonl")
    open(dataset, "w", encoding="utf-8").write("\n".join(lines) + "\n")
    run, export = os.path.join(args.work, "run"), os.path.join(args.work, "export")
    extra = ["--enable-thinking", args.enable_thinking] if args.enable_thinking else []
    cmd = [args.shardlm, "sft", "--model", model_dir, "--dataset", dataset, "--out", run, "--max-len", "384",
           "--lora-rank", "8", "--lora-alpha", "16", "--steps", "4", "--micro-batch", "4", "--global-batch", "8",
           "--threads", "2"] + extra
    print("$", " ".join(cmd))
    subprocess.run(cmd, check=True)
    subprocess.run([args.shardlm, "export", "--checkpoint", run, "--out", export, "--merge-lora"], check=True)
    meta = json.load(open(os.path.join(run, "data", "meta.json")))
    print("RUN/data chat_template:", meta["chat_template"], "from", meta["chat_template_origin"])

    tok = AutoTokenizer.from_pretrained(export)
    served = AutoModelForCausalLM.from_pretrained(export)
    kwargs = {"enable_thinking": args.enable_thinking == "true"} if args.enable_thinking else {}
    examples = read_sft(os.path.join(run, "data", "train.sft"))
    # train.sft keeps the examples in file order (no --val-fraction here).
    checked = 0
    for e, ((ids, mask), line) in enumerate(zip(examples, lines)):
        row = json.loads(line)
        prompt = tok.apply_chat_template([{"role": "user", "content": row["prompt"]}], add_generation_prompt=True,
                                         tokenize=True, **kwargs)
        prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
        first = mask.index(1)
        answer = tok.decode([t for t, m in zip(ids, mask) if m])
        rendered_answer = tok.apply_chat_template([{"role": "user", "content": row["prompt"]},
                                                   {"role": "assistant", "content": row["response"]}],
                                                  tokenize=False, **kwargs)
        rendered_answer = rendered_answer[len(tok.decode(prompt)):]
        # An example cut to --max-len (384) keeps a prefix of its answer.
        ok = ids[:first] == prompt and rendered_answer.startswith(answer) and (
            answer.endswith("<|im_end|>") or len(ids) == 384)
        checked += ok
        if e == 0:
            print("served prompt (transformers apply_chat_template, add_generation_prompt=True):")
            print(repr(tok.decode(prompt)))
            print("trained targets (shardlm's mask):")
            print(repr(answer))
            out = served.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)
            print("the export's first 8 generated tokens:", repr(tok.decode(out[0][len(prompt):])))
        if not ok:
            print(f"example {e}: MISMATCH prompt_equal={ids[:first] == prompt}")
    print(f"{checked}/{len(examples)} examples: tokens before the first target == transformers' served prompt, "
          f"targets == the template's answer through <|im_end|> (transformers {transformers.__version__})")
    sys.exit(0 if checked == len(examples) else 1)


if __name__ == "__main__":
    main()
