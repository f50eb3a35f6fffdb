#!/usr/bin/env python3
"""Writes tests/fixtures/lora_{qwen3_moe,mixtral,qwen2_moe}_fixture.safetensors: an
independent reference for shardlm's LoRA on mixture-of-experts models, computed by PyPI
PEFT on transformers' own Qwen3MoeForCausalLM / MixtralForCausalLM / Qwen2MoeForCausalLM
(make_moe_fixture.py's models) in float64, stored as float32.

PEFT 0.21 adapts transformers 5's fused experts through `target_parameters`
(lora.ParamWrapper on mlp.experts.gate_up_proj [E, 2I, C] and mlp.experts.down_proj
[E, C, I]): lora_A is [E r, in] (expert e's A_e = rows e r .. e r + r - 1; gate and up
share it), lora_B is [out, r E] (B_e[o, j] = lora_B[o, j E + e]), delta W_e = (alpha / r)
B_e A_e. shardlm stores each expert's pair in its own unit; this fixture stores them so:
  model.layers.L.mlp.experts.N.{gate_up_proj,down_proj}.lora_{A,B}.weight  A_e, B_e
and PEFT's fused tensors as save_pretrained writes them (what shardlm's export must
give back bitwise) under "peft." + their saved names.

The adapters (LoraConfig(r=4, lora_alpha=8), lora_B random: PEFT's zero init would test
nothing of lora_A):
  qwen3_moe  q_proj, v_proj + experts.gate_up_proj, experts.down_proj
  mixtral    o_proj + experts.gate_up_proj (one wrapper: no ".base_layer" in its names)
  qwen2_moe  q_proj, k_proj + experts.down_proj
Contents as make_lora_fixture.py's (loss includes router_aux_loss_coef x aux loss, as
make_moe_fixture.py's), the frozen base under the per-expert names of
make_moe_fixture.py, plus ce_loss, aux_loss and NAME.adamw_least_moment_fraction per
adapter tensor (llama_fixture_support.hpp).

Run: /work/venv/bin/python tools/make_moe_lora_fixture.py   (PyPI torch, transformers, peft)
"""
import json
import os
import sys

import numpy as np
import peft
import torch
import transformers

from make_gpt2_fixture import write_safetensors
from make_llama_fixture import ADAMW, B, T
from make_moe_fixture import (FAMILIES, build, per_expert, shardlm_config, step_loss,
                              untied_batch, with_shared_expert)

RANK, ALPHA = 4, 8.0
TARGETS = {
    "qwen3_moe": (["q_proj", "v_proj"], ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]),
    "mixtral": (["o_proj"], ["mlp.experts.gate_up_proj"]),
    "qwen2_moe": (["q_proj", "k_proj"], ["mlp.experts.down_proj"]),
}
# Fixtures of their own (name: family, seed, targets). qwen2_moe_mlp: PEFT's
# target_modules gate_proj/up_proj/down_proj match qwen2_moe's nn.Linear modules of those
# names, the shared expert's of sparse layers (1, 3) and the dense MLP's (0, 2:
# decoder_sparse_step 2), never the fused experts (parameters, only target_parameters
# reaches them; PEFT converts no qwen2_moe target names, unlike qwen3_moe's and mixtral's).
EXTRA = {
    "qwen2_moe_mlp": ("qwen2_moe", 74, (["q_proj", "gate_proj", "up_proj", "down_proj"],
                                         ["mlp.experts.gate_up_proj"])),
}


def lora_model(spec, targets, seed, gen):
    model, config = build(spec, seed)
    base = {}
    for n, p in model.named_parameters():
        for name, t in per_expert(spec, n, p.detach().clone()):
            base[name] = t
    modules, parameters = targets
    lora = peft.get_peft_model(model, peft.LoraConfig(
        r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, bias="none", target_modules=modules,
        target_parameters=parameters, task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
    return lora, config, base


def adapter_views(lora, spec):
    """shardlm's name -> a function of a fused tensor (value, gradient, moment) giving
    that name's part, and the fused parameter it comes from."""
    E = spec["experts"]
    views = {}
    for mname, module in lora.named_modules():
        if not hasattr(module, "lora_A") or "default" not in module.lora_A:
            continue
        a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
        if type(module).__name__ == "ParamWrapper":
            layer = int(mname.split(".layers.")[1].split(".")[0])
            proj = module.parameter_name
            for e in range(E):
                prefix = f"model.layers.{layer}.mlp.experts.{e}.{proj}"
                views[prefix + ".lora_A.weight"] = (a, lambda t, e=e: t[e * RANK:(e + 1) * RANK, :])
                views[prefix + ".lora_B.weight"] = (
                    b, lambda t, e=e: t.reshape(t.shape[0], RANK, E)[:, :, e])
        else:
            name = mname.replace("base_model.model.", "", 1)
            views[name + ".lora_A.weight"] = (a, lambda t: t)
            views[name + ".lora_B.weight"] = (b, lambda t: t)
    return views


def write_fixture(out_dir, name, family, spec, seed, targets):
    coef = spec["hf"]["router_aux_loss_coef"]
    lora, base, tokens, labels = untied_batch(
        name, spec, seed, 300 + seed,
        lambda model_seed, gen: (lambda m, _, b: (m, b))(*lora_model(spec, targets, model_seed, gen)))
    views = adapter_views(lora, spec)
    params = [p for p in lora.parameters() if p.requires_grad]
    assert len({id(p) for p, _ in views.values()}) == len(params)
    saved = {k: v.detach().clone() for k, v in peft.get_peft_model_state_dict(lora).items()}
    initial = {n: part(p.detach().clone()) for n, (p, part) in views.items()}

    loss, ce, aux, logits, _ = step_loss(lora, tokens, labels, coef)
    loss.backward()
    grads = {n: part(p.grad.detach().clone()) for n, (p, part) in views.items()}
    lora.zero_grad()

    opt = torch.optim.AdamW(params, lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]),
                            eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"])
    grad_norms, step_losses, least = [], [], {}
    for _ in range(ADAMW["steps"]):
        opt.zero_grad()
        l, _, _, _, _ = step_loss(lora, tokens, labels, coef)
        l.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, ADAMW["grad_clip"])
        assert norm.item() > ADAMW["grad_clip"], "clipping must be active in the fixture"
        grad_norms.append(norm.item())
        step_losses.append(l.item())
        opt.step()
        for n, (p, part) in views.items():
            m = part(opt.state[p]["exp_avg"].detach()).abs()
            frac = m / m.max().clamp_min(1e-300)
            least[n] = frac if n not in least else torch.minimum(least[n], frac)

    f32 = lambda t: t.detach().to(torch.float32).contiguous().numpy()
    tensors = [("tokens", tokens.to(torch.int32).numpy()),
               ("targets", labels.to(torch.int32).numpy()),
               ("loss", np.array([loss.item()], dtype=np.float32)),
               ("ce_loss", np.array([ce.item()], dtype=np.float32)),
               ("aux_loss", np.array([aux.item()], dtype=np.float32)),
               ("logits", f32(logits)),
               ("adamw.grad_norms", np.array(grad_norms, dtype=np.float32)),
               ("adamw.losses", np.array(step_losses, dtype=np.float32))]
    for n, t in base.items():
        tensors.append((n, f32(t)))
    for n, (p, part) in views.items():
        tensors.append((n, f32(initial[n])))
        tensors.append((n + ".grad", f32(grads[n])))
        tensors.append((n + ".after_3_steps", f32(part(p.detach()))))
        tensors.append((n + ".adamw_least_moment_fraction", f32(least[n])))
    for n, t in saved.items():
        tensors.append(("peft." + n, f32(t)))
    modules, parameters = targets
    cfg = with_shared_expert(shardlm_config(family, spec), spec["hf"])
    cfg["lora"] = {"rank": RANK, "alpha": ALPHA,
                   "targets": modules + [p.replace("mlp.", "", 1) for p in parameters]}
    metadata = {
        "config": json.dumps(cfg),
        "batch": json.dumps({"B": B, "T": T, "ignore_index": -1}),
        "adamw": json.dumps(ADAMW),
        "peft_config": json.dumps(lora.peft_config["default"].to_dict(),
                                  default=lambda o: sorted(o) if isinstance(o, set) else str(o)),
        "generator": f"tools/make_moe_lora_fixture.py (peft {peft.__version__}, transformers "
                     f"{transformers.__version__}, float64, stored as float32)",
    }
    path = os.path.join(out_dir, f"lora_{name}_fixture.safetensors")
    write_safetensors(path, tensors, metadata)
    print(f"wrote {os.path.normpath(path)}: loss {loss.item():.6f} (aux {aux.item():.6f}), "
          f"{len(views)} adapter tensors, PEFT saves {sorted(saved)[-2:]}, "
          f"{os.path.getsize(path)} bytes")


def main():
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
    only = set(sys.argv[1:])  # fixture names to write (default: all)
    fixtures = [(family, family, spec, seed, TARGETS[family])
                for seed, (family, spec) in enumerate(FAMILIES.items(), start=71)]
    fixtures += [(name, family, FAMILIES[family], seed, targets)
                 for name, (family, seed, targets) in EXTRA.items()]
    for name, family, spec, seed, targets in fixtures:
        if not only or name in only:
            write_fixture(out_dir, name, family, spec, seed, targets)


if __name__ == "__main__":
    main()
