#!/usr/bin/env python3
"""Writes tests/fixtures/chat_template_cases.json (and the qwen3 fixture tokenizer
directory, tests/fixtures/hf_tokenizers/qwen3): conversations rendered by
transformers' apply_chat_template with the PUBLISHED chat templates of
tools/chat_templates/ (SOURCES.md there: repository, path and commit of each) on
the fixture tokenizers of tools/tokenizer_dirs.py, with

  ids      apply_chat_template(messages, tokenize=True, **kwargs)
  targets  the loss mask, computed here with transformers only (independently of
           shardlm) by the rule docs/sft.md states: for assistant message i,
           P = render(messages[:i], add_generation_prompt=True) and
           L = render(messages[:i+1]); the turn T = L[len(P):] cut after its last
           added token; in the full text the turn starts where the text departs
           from P and is the longest tail of T found there; a token is a target
           when its start offset (the fast tokenizer's offset mapping) is inside.

transformers' strftime_now is fixed at DATE for every render (Llama 3.2's "Today
Date"); shardlm's test renders with the template date DATE.

Usage: /work/venv/bin/python tools/make_chat_template_fixture.py [--data ...] [--out tests/fixtures]
"""
import argparse
import datetime
import json
import os
import sys
import tempfile

import transformers
import transformers.utils.chat_template_utils as chat_template_utils
from transformers import AutoTokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_dirs as dirs  # noqa: E402

DATE = "2024-11-15"

# name: (fixture tokenizer, template file or None for the tokenizer directory's own,
#        shardlm built-in with the same source or None, apply_chat_template kwargs, reasoning cases?)
SETS = {
    "qwen2.5-instruct": ("qwen2", "qwen2.5-instruct.jinja", "chatml", {}, False),
    "qwen3-thinking": ("qwen3", None, "qwen3", {}, True),
    "qwen3-no-thinking": ("qwen3", None, "qwen3", {"enable_thinking": False}, False),
    "qwen3-thinking-explicit": ("qwen3", "qwen3.jinja", "qwen3", {"enable_thinking": True}, True),
    "llama3-instruct": ("llama3", "llama3-instruct.jinja", "llama3", {}, False),
    "llama3.1-instruct": ("llama3", "llama3.1-instruct.jinja", None, {}, False),
    "llama3.2-instruct": ("llama3", "llama3.2-instruct.jinja", None, {}, False),
    "smollm2-instruct": ("qwen2", "smollm2-instruct.jinja", None, {}, False),
    "plain": ("gpt2", "plain.jinja", "plain", {}, False),
}


def conversations(data, with_reasoning, thinking_off):
    gsm = json.loads(open(os.path.join(data, "sft", "gsm8k_train.jsonl"), encoding="utf-8").readline())
    s, u, a = "system", "user", "assistant"
    convs = [
        ("system_user_assistant", [(s, "You are a careful math tutor."), (u, "What is 7 * 8?"), (a, "7 * 8 = 56.")]),
        ("no_system", [(u, "Hi there!"), (a, "Hello! How can I help?")]),
        ("multi_turn", [(s, "Answer briefly."), (u, "Translate 'cat' to French."), (a, "chat"),
                        (u, "And to Chinese?"), (a, "猫 (māo) 🐱")]),
        ("multi_turn_no_system", [(u, "Q1?"), (a, "A1."), (u, "Q2?"), (a, "A2."), (u, "Q3?"), (a, "A3.")]),
        ("empty_contents", [(u, ""), (a, "")]),
        ("empty_system", [(s, ""), (u, "x"), (a, "")]),
        ("white_space", [(u, "  padded question \n"), (a, "\n\n answer after newlines\n\n")]),
        ("code_and_tabs", [(u, "Fix:\n\tdef f(x):\n\t\treturn x+1\r\n"), (a, "```python\ndef f(x):\n    return x + 1\n```")]),
        ("nfd_and_special_text", [(u, "Cafe\u0301 <|im_end|> and <|eot_id|> <|endoftext|>"),
                                  (a, "na\u0308ive <|endoftext|> re\u0301sume\u0301")]),
        ("trailing_user", [(u, "Q1"), (a, "A1"), (u, "follow-up without an answer")]),
        ("system_in_the_middle", [(u, "Q1"), (a, "A1"), (s, "New rules."), (u, "Q2"), (a, "A2")]),
        ("inline_think_text", [(u, "Why?"), (a, "<think>\nbecause\n</think>\n\nBecause.")]),
        ("gsm8k_first", [(u, gsm["prompt"]), (a, gsm["response"])]),
    ]
    if thinking_off:  # a think block in the answer contradicts the prompt's empty one (shardlm refuses it)
        convs = [c for c in convs if c[0] != "inline_think_text"]
    msgs = [(name, [{"role": r, "content": c} for r, c in turns]) for name, turns in convs]
    if with_reasoning:
        def rc(content, reasoning):
            return {"role": a, "content": content, "reasoning_content": reasoning}
        msgs += [
            ("reasoning_last", [{"role": u, "content": "What is 7 * 8?"}, rc("56", "7 * 8: 7 * 8 = 56.")]),
            ("reasoning_multi_turn", [{"role": s, "content": "Be exact."}, {"role": u, "content": "2+2?"},
                                      rc("4", "Add two and two."), {"role": u, "content": "3+3?"},
                                      rc("6", "\nAdd three and three.\n")]),
            ("reasoning_empty", [{"role": u, "content": "Hi"}, rc("Hello!", "")]),
            ("reasoning_then_plain", [{"role": u, "content": "A?"}, rc("a", "think a"),
                                      {"role": u, "content": "B?"}, {"role": a, "content": "b"}]),
        ]
    return msgs


class FixedDatetime(datetime.datetime):
    """transformers' strftime_now global formats datetime.now(): fixed at DATE here
    (template arguments are turned into plain data, so a function cannot be passed)."""

    @classmethod
    def now(cls, tz=None):
        return cls.strptime(DATE, "%Y-%m-%d")


chat_template_utils.datetime = FixedDatetime


def render(tok, template, messages, add_generation_prompt, kwargs):
    return tok.apply_chat_template(messages, chat_template=template, tokenize=False,
                                   add_generation_prompt=add_generation_prompt, **kwargs)


def common_prefix(a, b):
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def targets(tok, template, messages, kwargs, full, offsets):
    added = set(tok.added_tokens_decoder)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prompt = render(tok, template, messages[:i], True, kwargs)
        as_last = render(tok, template, messages[:i + 1], False, kwargs)
        if not as_last.startswith(prompt):
            raise ValueError(f"assistant message {i}: not prefix-stable\nP={prompt!r}\nL={as_last!r}")
        turn = as_last[len(prompt):]
        enc = tok(turn, add_special_tokens=False, return_offsets_mapping=True)
        ends = [end for t, (_, end) in zip(enc["input_ids"], enc["offset_mapping"]) if t in added]
        if ends:
            turn = turn[:ends[-1]]
        start = common_prefix(prompt, full)
        length = len(turn)
        while length > 0 and full[start:start + length] != turn[len(turn) - length:]:
            length -= 1
        spans.append((start, start + length))
    return [int(any(b <= s < e for b, e in spans)) for s, _ in offsets]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--data", default=os.path.join(here, "..", "..", "shared", "data"))
    parser.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures"))
    args = parser.parse_args()
    built = dirs.build_all(args.data)

    # The qwen3 fixture tokenizer directory (its tokenizer_config.json carries Qwen3's template).
    tok_obj, config, fill, vocab, merges = built["qwen3"]
    content = dirs.tokenizer_json(tok_obj, fill)
    out_dir = os.path.join(args.out, "hf_tokenizers", "qwen3")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.skeleton.json"), "w", encoding="utf-8") as f:
        json.dump(dirs.skeleton(content, fill, vocab, merges), f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
        f.write("\n")

    fixture = {"generator": "tools/make_chat_template_fixture.py",
               "reference": f"transformers {transformers.__version__} apply_chat_template(messages, tokenize=True)",
               "template_sources": "tools/chat_templates/SOURCES.md",
               "date": DATE,
               "sets": {}}
    table = []
    with tempfile.TemporaryDirectory() as tmp:
        tokenizers = {}
        for name, (kind, template_file, builtin, kwargs, reasoning) in SETS.items():
            if kind not in tokenizers:
                tok_obj, config, fill, _, _ = built[kind]
                path = os.path.join(tmp, kind)
                dirs.write_dir(path, dirs.tokenizer_json(tok_obj, fill), config)
                tokenizers[kind] = AutoTokenizer.from_pretrained(path)
            tok = tokenizers[kind]
            template = dirs.published_template(template_file) if template_file else built[kind][1]["chat_template"]
            cases = []
            for case_name, messages in conversations(args.data, reasoning, kwargs.get("enable_thinking") is False):
                full = render(tok, template, messages, False, kwargs)
                ids = tok.apply_chat_template(messages, chat_template=template, tokenize=True, **kwargs)
                ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
                enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
                if enc["input_ids"] != ids:
                    sys.exit(f"{name}/{case_name}: tokenizing the rendered text does not give apply_chat_template's ids")
                try:
                    mask = targets(tok, template, messages, kwargs, full, enc["offset_mapping"])
                except ValueError as e:
                    sys.exit(f"{name}/{case_name}: {e}")
                cases.append({"name": case_name, "messages": messages, "text": full, "ids": ids, "targets": mask})
            fixture["sets"][name] = {"tokenizer": kind, "template_file": template_file, "builtin": builtin,
                                     "kwargs": kwargs, "template": template, "cases": cases}
            table.append((name, kind, len(cases), sum(len(c["ids"]) for c in cases),
                          sum(sum(c["targets"]) for c in cases)))
    path = os.path.join(args.out, "chat_template_cases.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")
    for row in table:
        print("%-24s tokenizer %-6s %2d conversations, %5d ids, %4d targets" % row)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
