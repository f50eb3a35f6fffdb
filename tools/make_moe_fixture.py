#!/usr/bin/env python3
"""Writes tests/fixtures/{qwen3_moe,mixtral,qwen2_moe}_fixture.safetensors: independent
references for shardlm's mixture-of-experts forward, backward and AdamW step, computed by
Hugging Face transformers' own Qwen3MoeForCausalLM / MixtralForCausalLM /
Qwen2MoeForCausalLM in float64 (stored as
float32), with the load-balancing loss (output_router_logits) added as transformers adds
it: loss = mean cross-entropy + router_aux_loss_coef * aux_loss, aux over all B x T
tokens (no attention mask) and all sparse layers.

transformers computes the routing softmax in float32 even in a float64 model (the top-k
weights and the aux loss's sums carry float32 rounding, ~1e-7 relative, far below the
tests' 1e-5); everything else, rotary embedding included (make_llama_fixture's float64
rotary), is float64.

The models (odd on purpose; a large aux coefficient so that its gradient shows):
  qwen3_moe  3 layers x 64, GQA 4:2, head_dim 16, q/k norms, untied head; 8 experts of
             width 32, top-2, norm_topk_prob; layer 1 dense (mlp_only_layers, width 96)
  mixtral    2 layers x 64, GQA 4:2, 4 experts of width 48, top-2, untied head
  qwen2_moe  4 layers x 64, GQA 4:2, q/k/v biases; 8 experts of width 32, top-3, top-k
             weights not renormalised (norm_topk_prob false); a shared expert of width
             40 with its sigmoid gate; decoder_sparse_step 2 (layers 1 and 3 sparse,
             0 and 2 dense of width 96)
The batch is checked to have no near-tie at the k-th routing choice (a float32 flip
there would be a different model, not an error).

transformers 5.24 holds the experts fused (mlp.experts.gate_up_proj [E, 2I, C],
down_proj [E, C, I]) and save_pretrained writes them back one tensor per expert, under
the names every published checkpoint has; this fixture stores them so:
  qwen3_moe  model.layers.L.mlp.experts.N.{gate_proj,up_proj,down_proj}.weight
  mixtral    model.layers.L.block_sparse_moe.experts.N.{w1,w3,w2}.weight, block_sparse_moe.gate
  qwen2_moe  as qwen3_moe, plus model.layers.L.mlp.shared_expert.{gate,up,down}_proj.weight
             and mlp.shared_expert_gate.weight [1, C] (plain nn.Linear modules)
Contents as tools/make_llama_fixture.py's fixtures, plus
  aux_loss               [1] the load-balancing loss (before the coefficient)
  ce_loss                [1] the mean cross-entropy alone
  NAME.adamw_least_moment_fraction  per element, min over the three AdamW steps of
                         |m| / max |m of its tensor| (m: AdamW's first moment after the
                         step; which elements the weight check can hold tightly:
                         llama_fixture_support.hpp)
Also writes tests/fixtures/hf/{qwen3_moe,mixtral,qwen2_moe}/ (save_pretrained, fp32) and their
float64 logits on make_llama_fixture's token sequence in hf/moe_logits.safetensors,
and prints the tensor names save_pretrained wrote.

Run: /work/venv/bin/python tools/make_moe_fixture.py   (PyPI torch + transformers)
"""
import json
import math
import os

import numpy as np
import torch
import transformers
from safetensors import safe_open
from transformers import (MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM)

from make_gpt2_fixture import write_safetensors
from make_llama_fixture import ADAMW, B, HF_TOKENS, IGNORED, T, VOCAB, make_float64_rotary

FAMILIES = {
    "qwen3_moe": dict(
        cls=(Qwen3MoeConfig, Qwen3MoeForCausalLM),
        hf=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=False,
                attention_bias=False, hidden_act="silu", rope_theta=1000000.0,
                use_sliding_window=False, num_experts=8, num_experts_per_tok=2,
                moe_intermediate_size=32, norm_topk_prob=True, decoder_sparse_step=1,
                mlp_only_layers=[1], output_router_logits=True, router_aux_loss_coef=0.25),
        experts=8, top_k=2, width=32, block="mlp", modules=("gate_proj", "up_proj", "down_proj")),
    "mixtral": dict(
        cls=(MixtralConfig, MixtralForCausalLM),
        hf=dict(hidden_size=64, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                max_position_embeddings=1024, rms_norm_eps=1e-5, tie_word_embeddings=False,
                hidden_act="silu", rope_theta=1000000.0, num_local_experts=4,
                num_experts_per_tok=2, output_router_logits=True, router_aux_loss_coef=0.25,
                sliding_window=None),
        experts=4, top_k=2, width=48, block="block_sparse_moe", modules=("w1", "w3", "w2")),
    "qwen2_moe": dict(
        cls=(Qwen2MoeConfig, Qwen2MoeForCausalLM),
        hf=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=False,
                qkv_bias=True, hidden_act="silu", rope_theta=1000000.0,
                use_sliding_window=False, num_experts=8, num_experts_per_tok=3,
                moe_intermediate_size=32, shared_expert_intermediate_size=40,
                norm_topk_prob=False, decoder_sparse_step=2, mlp_only_layers=[],
                output_router_logits=True, router_aux_loss_coef=0.25),
        experts=8, top_k=3, width=32, block="mlp", modules=("gate_proj", "up_proj", "down_proj")),
}


def shardlm_config(family, spec):
    hf = spec["hf"]
    return {
        "family": family, "n_layer": hf["num_hidden_layers"], "n_head": hf["num_attention_heads"],
        "n_embd": hf["hidden_size"], "vocab_size": VOCAB, "max_seq_len": hf["max_position_embeddings"],
        "init_std": 0.02, "tie_embeddings": False, "n_kv_head": hf["num_key_value_heads"],
        "head_dim": hf["head_dim"], "intermediate_size": hf["intermediate_size"],
        "rope_theta": hf["rope_theta"], "rope_scaling": {"type": "default"},
        "norm_eps": hf["rms_norm_eps"], "qkv_bias": hf.get("qkv_bias", False), "o_bias": False,
        "qk_norm": family == "qwen3_moe",
        "moe": {"num_experts": spec["experts"], "top_k": spec["top_k"],
                "expert_intermediate_size": spec["width"],
                "norm_topk_prob": hf.get("norm_topk_prob", True),
                "decoder_sparse_step": hf.get("decoder_sparse_step", 1),
                "mlp_only_layers": hf.get("mlp_only_layers", []),
                "router_aux_loss_coef": hf["router_aux_loss_coef"],
                "output_router_logits": True},
    }


def with_shared_expert(config, hf):
    if "shared_expert_intermediate_size" in hf:
        config["moe"]["shared_expert_intermediate_size"] = hf["shared_expert_intermediate_size"]
    return config


def randomize(model, gen):
    """Weights large enough that softmax, norms and routing all matter."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
            elif "embed_tokens" in name or name == "lm_head.weight":
                p.copy_(0.3 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 1.2 / math.sqrt(fan_in))


def per_expert(spec, name, tensor):
    """shardlm's (and the saved checkpoints') names and tensors for one HF parameter."""
    E, I = spec["experts"], spec["width"]
    gate, up, down = spec["modules"]
    block = spec["block"]
    if name.endswith("mlp.experts.gate_up_proj"):
        prefix = name[: -len("mlp.experts.gate_up_proj")] + block + ".experts."
        out = []
        for e in range(E):
            out.append((f"{prefix}{e}.{gate}.weight", tensor[e, :I, :]))
            out.append((f"{prefix}{e}.{up}.weight", tensor[e, I:, :]))
        return out
    if name.endswith("mlp.experts.down_proj"):
        prefix = name[: -len("mlp.experts.down_proj")] + block + ".experts."
        return [(f"{prefix}{e}.{down}.weight", tensor[e]) for e in range(E)]
    if name.endswith("mlp.gate.weight") and block != "mlp":
        return [(name.replace(".mlp.gate.", f".{block}.gate."), tensor)]
    return [(name, tensor)]


def step_loss(model, tokens, targets, coef):
    out = model(input_ids=tokens, output_router_logits=True)
    logits = out.logits
    ce = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1,
        reduction="mean")
    return ce + coef * out.aux_loss, ce, out.aux_loss, logits, out.router_logits


def min_topk_gap(router_logits, k):
    gap = float("inf")
    for layer in router_logits:
        p = torch.softmax(layer.to(torch.float64), dim=-1)
        top = torch.topk(p, k + 1, dim=-1).values
        gap = min(gap, (top[:, k - 1] - top[:, k]).min().item())
    return gap


def untied_batch(name, spec, seed, gen_seed, make):
    """The first of 50 attempts (model seed + 100 attempt, batch generator gen_seed +
    attempt) whose routing has no near-tie in the top-k (gap > 1e-4): make(model_seed,
    gen) gives (model, extra); returns model, extra, tokens, targets."""
    coef = spec["hf"]["router_aux_loss_coef"]
    for attempt in range(50):
        gen = torch.Generator().manual_seed(gen_seed + attempt)
        model, extra = make(seed + 100 * attempt, gen)
        tokens = torch.randint(0, VOCAB, (B, T), generator=gen)
        targets = torch.randint(0, VOCAB, (B, T), generator=gen)
        for b, t in IGNORED:
            targets[b, t] = -1
        with torch.no_grad():
            _, _, _, _, router_logits = step_loss(model, tokens, targets, coef)
        if min_topk_gap(router_logits, spec["top_k"]) > 1e-4:
            return model, extra, tokens, targets
    raise SystemExit(f"{name}: no batch without a near-tie in the routing")


def build(spec, seed):
    config_cls, model_cls = spec["cls"]
    config = config_cls(vocab_size=VOCAB, **spec["hf"])
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float64)
    make_float64_rotary(model, spec["hf"], spec["hf"]["head_dim"])
    randomize(model, torch.Generator().manual_seed(seed))
    return model, config


def main():
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
    for seed, (family, spec) in enumerate(FAMILIES.items(), start=41):
        coef = spec["hf"]["router_aux_loss_coef"]
        model, config, tokens, targets = untied_batch(
            family, spec, seed, 200 + seed, lambda model_seed, gen: build(spec, model_seed))

        params = dict(model.named_parameters())
        names = list(params.keys())
        initial = {n: params[n].detach().clone() for n in names}
        loss, ce, aux, logits, _ = step_loss(model, tokens, targets, coef)
        loss.backward()
        grads = {n: params[n].grad.detach().clone() for n in names}
        model.zero_grad()

        decay = [params[n] for n in names if params[n].dim() >= 2]
        no_decay = [params[n] for n in names if params[n].dim() < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": ADAMW["weight_decay"]},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"])
        grad_norms, step_losses, step_moments = [], [], []
        for _ in range(ADAMW["steps"]):
            opt.zero_grad()
            l, _, _, _, _ = step_loss(model, tokens, targets, coef)
            l.backward()
            norm = torch.nn.utils.clip_grad_norm_(list(params.values()), ADAMW["grad_clip"])
            assert norm.item() > ADAMW["grad_clip"], "clipping must be active in the fixture"
            grad_norms.append(norm.item())
            step_losses.append(l.item())
            opt.step()
            step_moments.append({n: opt.state[params[n]]["exp_avg"].detach().clone() for n in names})

        f32 = lambda t: t.detach().to(torch.float32).contiguous().numpy()
        tensors = [("tokens", tokens.to(torch.int32).numpy()),
                   ("targets", targets.to(torch.int32).numpy()),
                   ("loss", np.array([loss.item()], dtype=np.float32)),
                   ("ce_loss", np.array([ce.item()], dtype=np.float32)),
                   ("aux_loss", np.array([aux.item()], dtype=np.float32)),
                   ("logits", f32(logits)),
                   ("adamw.grad_norms", np.array(grad_norms, dtype=np.float32)),
                   ("adamw.losses", np.array(step_losses, dtype=np.float32))]
        for n in names:
            # Each element's smallest share of its tensor's largest first moment (AdamW's m,
            # the numerator of its step) over the three steps: where m is tiny at any step
            # (a gradient that starts tiny, or one that turns against the earlier ones),
            # float32's rounding noise moves m / sqrt(v) by a visible part of a step.
            fractions = [[(m.abs() / m.abs().max().clamp_min(1e-300)) for _, m in per_expert(spec, n, sm[n])]
                         for sm in step_moments]
            for i, ((name, w0), (_, g), (_, w3)) in enumerate(zip(per_expert(spec, n, initial[n]),
                                                                  per_expert(spec, n, grads[n]),
                                                                  per_expert(spec, n, params[n]))):
                tensors.append((name, f32(w0)))
                tensors.append((name + ".grad", f32(g)))
                tensors.append((name + ".after_3_steps", f32(w3)))
                least = torch.stack([f[i] for f in fractions]).min(dim=0).values
                tensors.append((name + ".adamw_least_moment_fraction", f32(least)))
        adamw = dict(ADAMW, decay="2-D tensors (every expert's matrices too)")
        metadata = {
            "config": json.dumps(with_shared_expert(shardlm_config(family, spec), spec["hf"])),
            "hf_config": config.to_json_string(use_diff=False),
            "batch": json.dumps({"B": B, "T": T, "ignore_index": -1}),
            "adamw": json.dumps(adamw),
            "generator": f"tools/make_moe_fixture.py (transformers {transformers.__version__}, "
                         f"torch {torch.__version__}, float64, stored as float32)",
        }
        path = os.path.join(out_dir, f"{family}_fixture.safetensors")
        write_safetensors(path, tensors, metadata)
        print(f"wrote {os.path.normpath(path)}: loss {loss.item():.6f} (ce {ce.item():.6f}, "
              f"aux {aux.item():.6f}), grad norms {[round(g, 4) for g in grad_norms]}, "
              f"{os.path.getsize(path)} bytes")


HF_DIRS = {
    "qwen3_moe": dict(hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                      max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False,
                      rope_theta=1000000.0, num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=24, norm_topk_prob=True, mlp_only_layers=[0]),
    "mixtral": dict(hidden_size=32, intermediate_size=40, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                    max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False,
                    rope_theta=1000000.0, num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                      max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False,
                      rope_theta=1000000.0, num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=24, shared_expert_intermediate_size=36,
                      norm_topk_prob=False, mlp_only_layers=[1], qkv_bias=True),
}


def write_hf_dirs():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "hf")
    logits_out = []
    for seed, (family, hf) in enumerate(HF_DIRS.items(), start=61):
        config_cls, model_cls = FAMILIES[family]["cls"]
        config = config_cls(vocab_size=VOCAB, **hf)
        config._attn_implementation = "eager"
        config._experts_implementation = "eager"
        torch.manual_seed(seed)
        model = model_cls(config).to(torch.float64)
        randomize(model, torch.Generator().manual_seed(seed))
        model = model.to(torch.float32)
        out = os.path.join(root, family)
        os.makedirs(out, exist_ok=True)
        for name in os.listdir(out):
            os.remove(os.path.join(out, name))
        model.save_pretrained(out)
        with safe_open(os.path.join(out, "model.safetensors"), "pt") as f:
            keys = sorted(f.keys())
        print(f"{family}: save_pretrained wrote {len(keys)} tensors, e.g. "
              f"{[k for k in keys if 'experts' in k or '.gate.' in k][:4]}")
        reference = model.to(torch.float64)
        make_float64_rotary(reference, hf, hf["head_dim"])
        with torch.no_grad():
            logits = reference(input_ids=torch.tensor([HF_TOKENS])).logits[0]
        logits_out.append((f"{family}.logits", logits.to(torch.float32).numpy()))
        print(f"wrote {os.path.normpath(out)}: {sorted(os.listdir(out))}")
    logits_out.append(("tokens", np.array(HF_TOKENS, dtype=np.int32)))
    write_safetensors(os.path.join(root, "moe_logits.safetensors"), logits_out,
                      {"generator": "tools/make_moe_fixture.py write_hf_dirs"})


if __name__ == "__main__":
    main()
    write_hf_dirs()
