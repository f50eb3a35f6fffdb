#!/usr/bin/env python3
"""Writes tests/fixtures/chat_template_cases.json: token ids of conversations
rendered by transformers' apply_chat_template(messages, tokenize=True) with the
real chat templates of the fixture tokenizer directories (tools/tokenizer_dirs.py:
Qwen2.5's template in qwen2/, Meta-Llama-3's in llama3/, shardlm's plain template
in gpt2/), and the loss targets computed here independently of shardlm: each
assistant turn's content plus its end-of-turn token is found in the rendered text,
and a token is a target when its character offset (from the fast tokenizer's
offset mapping) starts inside such a span.

Usage: /work/venv/bin/python tools/make_chat_template_fixture.py [--data ...] [--out tests/fixtures]
"""
import argparse
import json
import os
import sys
import tempfile

import transformers
from transformers import AutoTokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_dirs as dirs  # noqa: E402

KINDS = {"qwen2": ("chatml", "<|im_start|>assistant\n", "<|im_end|>"),
         "llama3": ("llama3", "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
         "gpt2": ("plain", "Assistant: ", "<|endoftext|>")}


def conversations(data):
    gsm = json.loads(open(os.path.join(data, "sft", "gsm8k_train.jsonl"), encoding="utf-8").readline())
    s, u, a = "system", "user", "assistant"
    return [
        ("system_user_assistant", [(s, "You are a careful math tutor."), (u, "What is 7 * 8?"), (a, "7 * 8 = 56.")]),
        ("no_system", [(u, "Hi there!"), (a, "Hello! How can I help?")]),
        ("multi_turn", [(s, "Answer briefly."), (u, "Translate 'cat' to French."), (a, "chat"),
                        (u, "And to Chinese?"), (a, "猫 (māo) 🐱")]),
        ("empty_contents", [(u, ""), (a, "")]),
        ("empty_system", [(s, ""), (u, "x"), (a, "")]),
        ("white_space", [(u, "  padded question \n"), (a, "\n\n answer after newlines\n\n")]),
        ("code_and_tabs", [(u, "Fix:\n\tdef f(x):\n\t\treturn x+1\r\n"), (a, "```python\ndef f(x):\n    return x + 1\n```")]),
        ("nfd_and_special_text", [(u, "Cafe\u0301 <|im_end|> and <|eot_id|> <|endoftext|>"),
                                  (a, "na\u0308ive <|endoftext|> re\u0301sume\u0301")]),
        ("trailing_user", [(u, "Q1"), (a, "A1"), (u, "follow-up without an answer")]),
        ("system_in_the_middle", [(u, "Q1"), (a, "A1"), (s, "New rules."), (u, "Q2"), (a, "A2")]),
        ("gsm8k_first", [(u, gsm["prompt"]), (a, gsm["response"])]),
    ]


def targets(tok, text, ids, messages, kind):
    _, header, end = KINDS[kind]
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    if enc["input_ids"] != ids:
        sys.exit(f"{kind}: tokenizing the rendered text does not give apply_chat_template's ids")
    spans, pos = [], 0
    for role, content in messages:
        if role != "assistant":
            continue
        if kind == "llama3":
            content = content.strip()
        needle = header + content + end
        at = text.find(needle, pos)
        if at < 0:
            sys.exit(f"{kind}: assistant turn {content!r} not found in the rendered text")
        spans.append((at + len(header), at + len(needle)))
        pos = at + len(needle)
    return [int(any(b <= start < e for b, e in spans)) for start, _ in enc["offset_mapping"]]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--data", default=os.path.join(here, "..", "..", "shared", "data"))
    parser.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures"))
    args = parser.parse_args()
    built = dirs.build_all(args.data)
    fixture = {"generator": "tools/make_chat_template_fixture.py",
               "reference": f"transformers {transformers.__version__} apply_chat_template(messages, tokenize=True)",
               "kinds": {}}
    convs = conversations(args.data)
    with tempfile.TemporaryDirectory() as tmp:
        for kind, (template, _, _) in KINDS.items():
            tok_obj, config, fill, _, _ = built[kind]
            path = os.path.join(tmp, kind)
            dirs.write_dir(path, dirs.tokenizer_json(tok_obj, fill), config)
            tok = AutoTokenizer.from_pretrained(path)
            cases = []
            for name, turns in convs:
                messages = [{"role": r, "content": c} for r, c in turns]
                ids = tok.apply_chat_template(messages, tokenize=True)["input_ids"]
                text = tok.apply_chat_template(messages, tokenize=False)
                cases.append({"name": name, "messages": messages, "text": text, "ids": ids,
                              "targets": targets(tok, text, ids, turns, kind)})
            fixture["kinds"][kind] = {"template": template, "cases": cases}
            print(f"{kind} ({template}): {len(cases)} conversations, "
                  f"{sum(len(c['ids']) for c in cases)} ids, {sum(sum(c['targets']) for c in cases)} targets")
    path = os.path.join(args.out, "chat_template_cases.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
