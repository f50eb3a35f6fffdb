"""Hugging Face tokenizer directories for shardlm's tests, built from the shared
data with PyPI `tokenizers` (no network; there are no real Llama/Qwen files here):

  gpt2    GPT-2's tokenizer.json from gpt2/vocab.json + merges.txt ("a b" merges)
  qwen2   Qwen2-style: vocab from qwen/qwen.tiktoken through the byte-level alphabet,
          merges derived from the ranks as transformers' TikTokenConverter does,
          NFC, Split(Qwen2 regex, Isolated) + ByteLevel(use_regex=false), Qwen2.5's
          added tokens, ByteLevel post-processor, ignore_merges=true (as the converter
          sets it: with merges derived from ranks, ignore_merges=false gives ids that
          differ from tiktoken's on about one text in six of the fixture's)
  qwen3   qwen2 plus Qwen3's four added tokens (<tool_response>, </tool_response>,
          <think>, </think>: ids 151665-151668, not special) and Qwen3's template
  llama3  Llama-3-style on the same vocabulary: Llama 3's regex, no normalizer,
          <|begin_of_text|> added as BOS by a TemplateProcessing post-processor,
          Llama 3's 256 special tokens from id 151643, ignore_merges=true, [a, b] merges

Each directory also gets tokenizer_config.json (with the model family's real chat
template). The committed fixtures keep these tokenizer.json files as *skeletons*:
model.vocab and model.merges replaced by a note saying how to rebuild them from
the shared data, plus the SHA-256 of their canonical form (canonical_sha256), so
the C++ tests rebuild the identical file without the fixtures carrying MiBs.
"""
import copy
import hashlib
import json
import os

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                 r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                  r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# Qwen2.5's added tokens (its tokenizer_config.json added_tokens_decoder): id, text, special.
QWEN25_ADDED = [(151643 + i, text, special) for i, (text, special) in enumerate([
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False)])]


# Qwen3's added tokens after Qwen2.5's (its tokenizer_config.json added_tokens_decoder).
QWEN3_EXTRA_ADDED = [(151665, "<tool_response>", False), (151666, "</tool_response>", False),
                     (151667, "<think>", False), (151668, "</think>", False)]

CHAT_TEMPLATE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chat_templates")


def published_template(name):
    """A published chat template of tools/chat_templates (SOURCES.md says where each came from)."""
    with open(os.path.join(CHAT_TEMPLATE_DIR, name), encoding="utf-8", newline="") as f:
        return f.read()


def llama3_special_names():
    """Llama 3.1's 256 special tokens in id order (offset 0 = <|begin_of_text|>)."""
    names = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
             "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
             "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
    names += [f"<|reserved_special_token_{i}|>" for i in range(3, 3 + 256 - len(names))]
    return names


# Qwen2.5-Instruct's chat template (tokenizer_config.json "chat_template"; public copies
# of the file, e.g. quoted in the swift-jinja and vLLM test suites, agree on it).
QWEN25_CHAT_TEMPLATE = (
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n            {{- '\\n' + message.content }}\n        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n        {%- endfor %}\n        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n        {%- endif %}\n        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n")

# Meta-Llama-3-8B-Instruct's chat template (many public copies agree on it).
LLAMA3_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

# shardlm's "plain" template for GPT-2-style models, written as Jinja so transformers
# renders it as the reference (docs/data-format.md describes it).
PLAIN_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] + '\n\n' }}"
    "{% elif message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\n\n' }}"
    "{% else %}{{ 'Assistant: ' + message['content'] + eos_token + '\n\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant: ' }}{% endif %}")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def gpt2_vocab_merges(data):
    vocab = json.load(open(os.path.join(data, "gpt2", "vocab.json"), encoding="utf-8"))
    lines = open(os.path.join(data, "gpt2", "merges.txt"), encoding="utf-8").read().split("\n")
    merges = [tuple(line.split(" ")) for line in lines[1:] if line]
    return vocab, merges


def load_ranks(path):
    import base64
    ranks = {}
    for line in open(path, "rb").read().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def tiktoken_vocab_merges(ranks):
    """transformers' TikTokenConverter.extract_vocab_merges_from_model, on loaded ranks."""
    byte_encoder = bytes_to_unicode()

    def text(b):
        return "".join(byte_encoder[x] for x in b)

    vocab, merges = {}, []
    for token, rank in ranks.items():
        vocab[text(token)] = rank
        if len(token) == 1:
            continue
        local = []
        for index in range(1, len(token)):
            left, right = token[:index], token[index:]
            if left in ranks and right in ranks and (left + right) in ranks:
                local.append((left, right, rank))
        local.sort(key=lambda x: (ranks[x[0]], ranks[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: m[2])
    return vocab, [(text(a), text(b)) for a, b, _ in merges]


def canonical_sha256(vocab, merges):
    """SHA-256 of "id\\ttoken\\n" lines in id order then "left\\tright\\n" per merge (UTF-8):
    the part of tokenizer.json the tests rebuild from the shared data."""
    h = hashlib.sha256()
    for token, i in sorted(vocab.items(), key=lambda kv: kv[1]):
        h.update(f"{i}\t{token}\n".encode("utf-8"))
    for a, b in merges:
        h.update(f"{a}\t{b}\n".encode("utf-8"))
    return h.hexdigest()


def build_gpt2(data):
    vocab, merges = gpt2_vocab_merges(data)
    tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=True)])
    config = {"add_prefix_space": False, "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
              "unk_token": "<|endoftext|>", "model_max_length": 1024, "tokenizer_class": "GPT2Tokenizer",
              "chat_template": PLAIN_CHAT_TEMPLATE}
    return tok, config, {"source": "gpt2", "merges_format": "strings"}, vocab, merges


def build_qwen2(data, vocab, merges):
    tok = Tokenizer(models.BPE(vocab, merges, dropout=None, unk_token=None, continuing_subword_prefix="",
                               end_of_word_suffix="", fuse_unk=False, byte_fallback=False, ignore_merges=True))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    for i, text, special in QWEN25_ADDED:
        added = AddedToken(text, special=special, normalized=False)
        (tok.add_special_tokens if special else tok.add_tokens)([added])
        assert tok.token_to_id(text) == i, (text, tok.token_to_id(text), i)
    config = {"add_bos_token": False, "add_prefix_space": False, "bos_token": None, "eos_token": "<|im_end|>",
              "pad_token": "<|endoftext|>", "unk_token": None, "errors": "replace", "model_max_length": 131072,
              "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer",
              "clean_up_tokenization_spaces": False, "chat_template": QWEN25_CHAT_TEMPLATE}
    return tok, config, {"source": "qwen.tiktoken", "merges_format": "pairs"}


def build_qwen3(data, vocab, merges):
    tok, config, fill = build_qwen2(data, vocab, merges)
    for i, text, special in QWEN3_EXTRA_ADDED:
        tok.add_tokens([AddedToken(text, special=special, normalized=False)])
        assert tok.token_to_id(text) == i, (text, tok.token_to_id(text), i)
    config = dict(config, chat_template=published_template("qwen3.jinja"))
    return tok, config, fill


def build_llama3(data, vocab, merges):
    tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    names = llama3_special_names()
    tok.add_special_tokens([AddedToken(name, special=True, normalized=False) for name in names])
    base = len(vocab)
    assert tok.token_to_id("<|begin_of_text|>") == base
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
                                      special_tokens=[("<|begin_of_text|>", base)])])
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "clean_up_tokenization_spaces": True,
              "model_input_names": ["input_ids", "attention_mask"], "model_max_length": 131072,
              "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": LLAMA3_CHAT_TEMPLATE}
    return tok, config, {"source": "qwen.tiktoken", "merges_format": "pairs"}


def build_all(data):
    """{kind: (Tokenizer, tokenizer_config dict, fill note, vocab, merges)}."""
    out = {}
    tok, config, fill, vocab, merges = build_gpt2(data)
    out["gpt2"] = (tok, config, fill, vocab, merges)
    qwen_vocab, qwen_merges = tiktoken_vocab_merges(load_ranks(os.path.join(data, "qwen", "qwen.tiktoken")))
    tok, config, fill = build_qwen2(data, qwen_vocab, qwen_merges)
    out["qwen2"] = (tok, config, fill, qwen_vocab, qwen_merges)
    tok, config, fill = build_llama3(data, qwen_vocab, qwen_merges)
    out["llama3"] = (tok, config, fill, qwen_vocab, qwen_merges)
    tok, config, fill = build_qwen3(data, qwen_vocab, qwen_merges)
    out["qwen3"] = (tok, config, fill, qwen_vocab, qwen_merges)
    return out


def tokenizer_json(tok, fill):
    """The tokenizer.json text, merges in the fill's format."""
    content = json.loads(tok.to_str())
    if fill["merges_format"] == "strings":
        content["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in content["model"]["merges"]]
    return content


def skeleton(content, fill, vocab, merges):
    s = copy.deepcopy(content)
    s["model"]["vocab"] = {"shardlm_fill": fill["source"]}
    s["model"]["merges"] = {"shardlm_fill": fill["source"], "format": fill["merges_format"],
                            "canonical_sha256": canonical_sha256(vocab, merges)}
    return s


def write_dir(path, content, config):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(content, f, ensure_ascii=False)
    with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
