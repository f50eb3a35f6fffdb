#!/usr/bin/env python3
"""Writes tests/fixtures/lora_{llama,qwen3}_fixture.safetensors: an independent
reference for shardlm's LoRA, computed by PyPI PEFT on transformers' own models in
float64 (stored as float32).

The base models are make_llama_fixture.py's llama (every linear layer targeted, untied
head, llama3 rope scaling) and qwen3 (q_proj and v_proj only; q/k norms). PEFT's
LoraConfig(r=4, lora_alpha=8, lora_dropout=0, bias="none"); lora_B is set to random
values (PEFT initialises it to zero, which would leave lora_A's gradient zero and test
nothing), so the fixture checks both matrices' gradients.

Contents (shardlm's names: PEFT's without "base_model.model." and ".default"):
  <base name>                the frozen base weights (HF shapes)
  <adapter name>             lora_A [r, in], lora_B [out, r]
  <adapter name>.grad        gradient of the mean loss (float64 PEFT)
  <adapter name>.after_3_steps   after 3 AdamW steps (clipping active) on the adapters only
  tokens, targets, loss, logits, adamw.grad_norms, adamw.losses
Metadata: "config" (shardlm ModelConfig JSON, with its "lora"), "batch", "adamw",
"peft_config" (PEFT's adapter_config as it would be saved).

Run: /work/venv/bin/python tools/make_lora_fixture.py   (PyPI torch, transformers, peft)
"""
import json
import os

import numpy as np
import peft
import torch

from make_gpt2_fixture import write_safetensors
from make_llama_fixture import (ADAMW, B, FAMILIES, IGNORED, T, VOCAB, build, mean_loss,
                                shardlm_config)

RANK, ALPHA = 4, 8.0
TARGETS = {"llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
           "qwen3": ["q_proj", "v_proj"]}


def ours(name):
    return name.replace("base_model.model.", "", 1).replace(".default", "")


def main():
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
    for seed, family in enumerate(TARGETS, start=41):
        spec = FAMILIES[family]
        model, _ = build(family, spec, seed)
        base = {n: p.detach().clone() for n, p in model.named_parameters()}
        if spec["hf"]["tie_word_embeddings"]:
            base.pop("lm_head.weight", None)
        config = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, bias="none",
                                 target_modules=TARGETS[family], task_type="CAUSAL_LM")
        lora = peft.get_peft_model(model, config)
        gen = torch.Generator().manual_seed(200 + seed)
        adapters = {}
        with torch.no_grad():
            for name, p in lora.named_parameters():
                if "lora_B" in name:
                    p.copy_(0.3 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
                if p.requires_grad:
                    adapters[ours(name)] = p
        tokens = torch.randint(0, VOCAB, (B, T), generator=gen)
        targets = torch.randint(0, VOCAB, (B, T), generator=gen)
        for b, t in IGNORED:
            targets[b, t] = -1
        initial = {n: p.detach().clone() for n, p in adapters.items()}
        loss, logits = mean_loss(lora, tokens, targets)
        loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in adapters.items()}
        lora.zero_grad()

        params = list(adapters.values())  # all 2-D: weight decay applies, as in shardlm
        opt = torch.optim.AdamW(params, lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]),
                                eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"])
        grad_norms, step_losses = [], []
        for _ in range(ADAMW["steps"]):
            opt.zero_grad()
            step_loss, _ = mean_loss(lora, tokens, targets)
            step_loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(params, ADAMW["grad_clip"])
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
        for n, p in base.items():
            tensors.append((n, f32(p)))
        for n in adapters:
            tensors.append((n, f32(initial[n])))
            tensors.append((n + ".grad", f32(grads[n])))
            tensors.append((n + ".after_3_steps", f32(adapters[n])))
        cfg = shardlm_config(family, spec)
        cfg["lora"] = {"rank": RANK, "alpha": ALPHA, "targets": TARGETS[family]}
        metadata = {
            "config": json.dumps(cfg),
            "batch": json.dumps({"B": B, "T": T, "ignore_index": -1}),
            "adamw": json.dumps(ADAMW),
            "peft_config": json.dumps(config.to_dict(), default=str),
            "generator": f"tools/make_lora_fixture.py (peft {peft.__version__}, float64)",
        }
        path = os.path.join(out_dir, f"lora_{family}_fixture.safetensors")
        write_safetensors(path, tensors, metadata)
        print(f"wrote {os.path.normpath(path)}: loss {loss.item():.6f}, "
              f"{len(adapters)} adapter tensors, {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
