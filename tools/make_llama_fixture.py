#!/usr/bin/env python3
"""Writes tests/fixtures/{llama,qwen2,qwen3}_fixture.safetensors: independent
references for shardlm's Llama-family forward, backward and AdamW step, computed by
Hugging Face transformers' own LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM
in float64 (stored as float32).

transformers computes rotary cos/sin in float32 even in a float64 model; this script
replaces the rotary module's inverse frequencies and forward with float64 ones (the
same formulas, llama3 scaling included) so that the reference is float64 throughout.

Each fixture is a deliberately odd tiny model (T = 37, head dims 24 and 40, grouped-
query attention) with weights large enough that attention, norms and biases matter:
  llama   GQA 4:2, head_dim 24, untied LM head, rope_scaling llama3 (factor 8)
  qwen2   GQA 4:2, head_dim 24, q/k/v biases, tied embeddings
  qwen3   GQA 3:1, head_dim 40 (!= hidden / heads), q_norm/k_norm, tied embeddings

Contents (names are Hugging Face's, shapes as HF stores them, vocabulary unpadded):
  <name>                 every parameter
  <name>.grad            gradient of the MEAN loss over non-ignored targets
  <name>.after_3_steps   weights after 3 AdamW steps (clipping active) on the same batch
  tokens, targets        int32 [B, T] (targets == -1 are ignored)
  loss                   [1] mean cross-entropy over non-ignored targets
  logits                 [B, T, vocab_size]
  adamw.grad_norms, adamw.losses   [3] per step
Metadata: "config" (shardlm ModelConfig JSON), "hf_config" (the config.json transformers
used), "batch", "adamw".

Also writes tests/fixtures/hf/{llama,qwen2,qwen3}/: tiny models saved by transformers'
own save_pretrained (config.json, generation_config.json, model.safetensors; the qwen2
one sharded into several files with model.safetensors.index.json, the llama one in
bfloat16), and hf_logits.safetensors beside them: each model's float64 logits on a
fixed token sequence, for the import test.

Run: /work/venv/bin/python tools/make_llama_fixture.py   (PyPI torch + transformers)
"""
import json
import math
import os

import numpy as np
import torch
import transformers
from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

from make_gpt2_fixture import write_safetensors

B, T = 2, 37
VOCAB = 101  # padded to 128 rows by shardlm
IGNORED = [(0, 0), (0, 5), (1, 3), (1, 36)]
ADAMW = {
    "lr": 1e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1,
    "grad_clip": 0.05, "steps": 3, "lr_schedule": "constant",
    "decay": "2-D tensors only (embeddings, projections, LM head)",
}

FAMILIES = {
    "llama": dict(
        cls=(LlamaConfig, LlamaForCausalLM),
        hf=dict(hidden_size=96, intermediate_size=160, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                max_position_embeddings=1024, rms_norm_eps=1e-5, tie_word_embeddings=False,
                attention_bias=False, mlp_bias=False, hidden_act="silu",
                rope_theta=10000.0,
                rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 64}),
        shardlm=dict(n_kv_head=2, head_dim=24, qkv_bias=False, o_bias=False, qk_norm=False)),
    "qwen2": dict(
        cls=(Qwen2Config, Qwen2ForCausalLM),
        hf=dict(hidden_size=96, intermediate_size=144, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=True,
                hidden_act="silu", rope_theta=1000000.0, use_sliding_window=False),
        shardlm=dict(n_kv_head=2, head_dim=24, qkv_bias=True, o_bias=False, qk_norm=False)),
    "qwen3": dict(
        cls=(Qwen3Config, Qwen3ForCausalLM),
        hf=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=3, num_key_value_heads=1, head_dim=40,
                max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=True,
                attention_bias=False, hidden_act="silu", rope_theta=1000000.0,
                use_sliding_window=False),
        shardlm=dict(n_kv_head=1, head_dim=40, qkv_bias=False, o_bias=False, qk_norm=True)),
}


def shardlm_config(family, spec):
    hf = spec["hf"]
    s = spec["shardlm"]
    scaling = hf.get("rope_scaling")
    return {
        "family": family, "n_layer": hf["num_hidden_layers"], "n_head": hf["num_attention_heads"],
        "n_embd": hf["hidden_size"], "vocab_size": VOCAB, "max_seq_len": hf["max_position_embeddings"],
        "init_std": 0.02, "tie_embeddings": hf["tie_word_embeddings"], "n_kv_head": s["n_kv_head"],
        "head_dim": s["head_dim"], "intermediate_size": hf["intermediate_size"],
        "rope_theta": hf["rope_theta"],
        "rope_scaling": ({"type": "llama3", "factor": scaling["factor"],
                          "low_freq_factor": scaling["low_freq_factor"],
                          "high_freq_factor": scaling["high_freq_factor"],
                          "original_max_position_embeddings":
                              scaling["original_max_position_embeddings"]}
                         if scaling else {"type": "default"}),
        "norm_eps": hf["rms_norm_eps"], "qkv_bias": s["qkv_bias"], "o_bias": s["o_bias"],
        "qk_norm": s["qk_norm"],
    }


def inv_freq_float64(hf, head_dim):
    """RoPE inverse frequencies in float64, llama3 scaling as published by Meta
    (the formula of transformers' _compute_llama3_parameters)."""
    inv = 1.0 / (hf["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    s = hf.get("rope_scaling")
    if not s:
        return inv
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def make_float64_rotary(model, hf, head_dim):
    rotary = model.model.rotary_emb
    inv = inv_freq_float64(hf, head_dim)

    def forward(x, position_ids):
        freqs = position_ids[..., None].to(torch.float64) * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    rotary.forward = forward


def randomize(model, gen):
    """Weights large enough that softmax, norms and biases all matter."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
            elif "embed_tokens" in name or name == "lm_head.weight":
                p.copy_(0.3 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
            else:
                fan_in = p.shape[1]
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 1.2 / math.sqrt(fan_in))


def canonical_params(model, tied):
    out = {}
    for name, p in model.named_parameters():
        out[name] = p
    if tied:
        out.pop("lm_head.weight", None)
    return out


def mean_loss(model, tokens, targets):
    logits = model(input_ids=tokens).logits
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1,
        reduction="mean"), logits


def build(family, spec, seed):
    config_cls, model_cls = spec["cls"]
    hf = dict(spec["hf"])
    config = config_cls(vocab_size=VOCAB, **hf)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float64)
    head_dim = spec["shardlm"]["head_dim"]
    make_float64_rotary(model, hf, head_dim)
    gen = torch.Generator().manual_seed(seed)
    randomize(model, gen)
    return model, config


def main():
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
    for seed, (family, spec) in enumerate(FAMILIES.items(), start=11):
        model, config = build(family, spec, seed)
        tied = spec["hf"]["tie_word_embeddings"]
        gen = torch.Generator().manual_seed(100 + seed)
        tokens = torch.randint(0, VOCAB, (B, T), generator=gen)
        targets = torch.randint(0, VOCAB, (B, T), generator=gen)
        for b, t in IGNORED:
            targets[b, t] = -1

        params = canonical_params(model, tied)
        names = list(params.keys())
        initial = {n: params[n].detach().clone() for n in names}
        loss, logits = mean_loss(model, tokens, targets)
        loss.backward()
        grads = {n: params[n].grad.detach().clone() for n in names}
        model.zero_grad()

        decay = [params[n] for n in names if params[n].dim() == 2]
        no_decay = [params[n] for n in names if params[n].dim() != 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": ADAMW["weight_decay"]},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"])
        grad_norms, step_losses = [], []
        for _ in range(ADAMW["steps"]):
            opt.zero_grad()
            step_loss, _ = mean_loss(model, tokens, targets)
            step_loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(list(params.values()), ADAMW["grad_clip"])
            assert norm.item() > ADAMW["grad_clip"], "clipping must be active in the fixture"
            grad_norms.append(norm.item())
            step_losses.append(step_loss.item())
            opt.step()

        f32 = lambda t: t.detach().to(torch.float32).numpy()
        tensors = [("tokens", tokens.to(torch.int32).numpy()),
                   ("targets", targets.to(torch.int32).numpy()),
                   ("loss", np.array([loss.item()], dtype=np.float32)),
                   ("logits", f32(logits)),
                   ("adamw.grad_norms", np.array(grad_norms, dtype=np.float32)),
                   ("adamw.losses", np.array(step_losses, dtype=np.float32))]
        for n in names:
            tensors.append((n, f32(initial[n])))
            tensors.append((n + ".grad", f32(grads[n])))
            tensors.append((n + ".after_3_steps", f32(params[n])))
        metadata = {
            "config": json.dumps(shardlm_config(family, spec)),
            "hf_config": config.to_json_string(use_diff=False),
            "batch": json.dumps({"B": B, "T": T, "ignore_index": -1}),
            "adamw": json.dumps(ADAMW),
            "generator": f"tools/make_llama_fixture.py (transformers {transformers.__version__}, "
                         f"torch {torch.__version__}, float64, stored as float32)",
        }
        path = os.path.join(out_dir, f"{family}_fixture.safetensors")
        write_safetensors(path, tensors, metadata)
        print(f"wrote {os.path.normpath(path)}: loss {loss.item():.6f}, grad norms "
              f"{[round(g, 4) for g in grad_norms]}, {os.path.getsize(path)} bytes")


HF_DIRS = {
    "llama": dict(hf=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                          max_position_embeddings=64, rms_norm_eps=1e-5,
                          tie_word_embeddings=False, rope_theta=10000.0,
                          rope_scaling={"rope_type": "llama3", "factor": 4.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 16}),
                  dtype=torch.bfloat16, shard=None),
    "qwen2": dict(hf=dict(hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=1,
                          max_position_embeddings=64, rms_norm_eps=1e-6,
                          tie_word_embeddings=True, rope_theta=1000000.0),
                  dtype=torch.float32, shard="20KB"),
    "qwen3": dict(hf=dict(hidden_size=32, intermediate_size=40, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=24,
                          max_position_embeddings=64, rms_norm_eps=1e-6,
                          tie_word_embeddings=False, rope_theta=1000000.0),
                  dtype=torch.float32, shard=None),
}
HF_TOKENS = [3, 17, 99, 42, 0, 5, 77, 100, 23, 61, 8, 8, 14]


def write_hf_dirs():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "hf")
    logits_out = []
    for seed, (family, spec) in enumerate(HF_DIRS.items(), start=31):
        config_cls, model_cls = FAMILIES[family]["cls"]
        config = config_cls(vocab_size=VOCAB, **spec["hf"])
        config._attn_implementation = "eager"
        torch.manual_seed(seed)
        model = model_cls(config)
        gen = torch.Generator().manual_seed(seed)
        model = model.to(torch.float64)
        randomize(model, gen)
        model = model.to(spec["dtype"])  # what is saved
        out = os.path.join(root, family)
        os.makedirs(out, exist_ok=True)
        for name in os.listdir(out):
            os.remove(os.path.join(out, name))
        kwargs = {"max_shard_size": spec["shard"]} if spec["shard"] else {}
        model.save_pretrained(out, **kwargs)
        # Reference logits of the saved weights, computed in float64.
        reference = model.to(torch.float64)
        hd = spec["hf"].get("head_dim", spec["hf"]["hidden_size"] // spec["hf"]["num_attention_heads"])
        make_float64_rotary(reference, spec["hf"], hd)
        with torch.no_grad():
            logits = reference(input_ids=torch.tensor([HF_TOKENS])).logits[0]
        logits_out.append((f"{family}.logits", logits.to(torch.float32).numpy()))
        print(f"wrote {os.path.normpath(out)}: {sorted(os.listdir(out))}")
    logits_out.append(("tokens", np.array(HF_TOKENS, dtype=np.int32)))
    write_safetensors(os.path.join(root, "hf_logits.safetensors"), logits_out,
                      {"generator": "tools/make_llama_fixture.py write_hf_dirs"})


if __name__ == "__main__":
    main()
    write_hf_dirs()
