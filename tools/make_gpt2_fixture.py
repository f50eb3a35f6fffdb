#!/usr/bin/env python3
"""Writes tests/fixtures/gpt2_fixture.safetensors: an independent reference for
shardlm's GPT-2 forward, backward and AdamW step.

The model here is a hand-written PyTorch GPT-2 (nanoGPT-like) that computes in
float64 with autograd; its tensors are stored as float32 under the Hugging Face
names and layouts shardlm uses (model/param_layout.cpp): Conv1D weights [in, out]
(y = x W + b), the token embedding padded to a multiple of 64 rows with zero
padding rows that never enter the softmax, LM head tied to wte.

Contents:
  <name>                 every parameter (float32)
  <name>.grad            gradient of the MEAN loss over non-ignored targets
  <name>.after_3_steps   weights after 3 AdamW steps on the same batch
  tokens, targets        int32 [B, T] (targets == -1 are ignored)
  loss                   [1] mean cross-entropy over non-ignored targets
  logits_last            [B, vocab_size] logits at the last position
  adamw.grad_norms       [3] global gradient norm before clipping, per step
  adamw.losses           [3] loss before each step
Metadata: "config" (ModelConfig JSON), "batch", "adamw" (hyperparameters).

Run with Debian's python3 (torch 1.13):  /usr/bin/python3 tools/make_gpt2_fixture.py
"""
import json
import math
import os
import struct

import numpy as np
import torch

CONFIG = {
    "family": "gpt2",
    "n_layer": 2,
    "n_head": 2,
    "n_embd": 16,  # head_dim 8
    "vocab_size": 67,  # padded to 128 rows
    "max_seq_len": 16,
    "init_std": 0.02,
    "tie_embeddings": True,
}
B, T = 2, 11
IGNORED_POSITIONS = [(0, 0), (0, 5), (1, 3), (1, 10)]
ADAMW = {
    "lr": 1e-2,
    "beta1": 0.9,
    "beta2": 0.95,
    "eps": 1e-8,
    "weight_decay": 0.1,  # decoupled, 2-D weights only (wte, wpe, c_attn/c_proj/c_fc weights)
    "grad_clip": 0.05,  # global L2 norm, so clipping is active
    "clip_formula": "torch.nn.utils.clip_grad_norm_: g *= grad_clip / (norm + 1e-6) if that is < 1",
    "update": "torch.optim.AdamW (bias-corrected; decay p *= 1 - lr * weight_decay before the step)",
    "steps": 3,
    "lr_schedule": "constant",
}
# GPT-2's init std (0.02) leaves a width-16 model with near-uniform attention and
# softmax, whose gradients would then be barely tested; these scales make scores,
# probabilities, LayerNorm affine parameters and biases all matter.
WEIGHT_STD = {"wte": 0.3, "wpe": 0.3, "c_attn": 0.35, "attn.c_proj": 0.2, "c_fc": 0.3,
              "mlp.c_proj": 0.2}
BIAS_STD = 0.1
LN_WEIGHT_STD = 0.2  # around 1
LN_BIAS_STD = 0.2
LN_EPS = 1e-5


def padded_vocab(v):
    return (v + 63) // 64 * 64


def make_params(gen):
    C = CONFIG["n_embd"]
    V = CONFIG["vocab_size"]
    Vp = padded_vocab(V)

    def normal(shape, std):
        return torch.randn(shape, generator=gen, dtype=torch.float64) * std

    params = {}
    wte = torch.zeros(Vp, C, dtype=torch.float64)
    wte[:V] = normal((V, C), WEIGHT_STD["wte"])
    params["transformer.wte.weight"] = wte
    params["transformer.wpe.weight"] = normal((CONFIG["max_seq_len"], C), WEIGHT_STD["wpe"])
    for l in range(CONFIG["n_layer"]):
        p = f"transformer.h.{l}."
        params[p + "ln_1.weight"] = 1.0 + normal((C,), LN_WEIGHT_STD)
        params[p + "ln_1.bias"] = normal((C,), LN_BIAS_STD)
        params[p + "attn.c_attn.weight"] = normal((C, 3 * C), WEIGHT_STD["c_attn"])
        params[p + "attn.c_attn.bias"] = normal((3 * C,), BIAS_STD)
        params[p + "attn.c_proj.weight"] = normal((C, C), WEIGHT_STD["attn.c_proj"])
        params[p + "attn.c_proj.bias"] = normal((C,), BIAS_STD)
        params[p + "ln_2.weight"] = 1.0 + normal((C,), LN_WEIGHT_STD)
        params[p + "ln_2.bias"] = normal((C,), LN_BIAS_STD)
        params[p + "mlp.c_fc.weight"] = normal((C, 4 * C), WEIGHT_STD["c_fc"])
        params[p + "mlp.c_fc.bias"] = normal((4 * C,), BIAS_STD)
        params[p + "mlp.c_proj.weight"] = normal((4 * C, C), WEIGHT_STD["mlp.c_proj"])
        params[p + "mlp.c_proj.bias"] = normal((C,), BIAS_STD)
    params["transformer.ln_f.weight"] = 1.0 + normal((C,), LN_WEIGHT_STD)
    params["transformer.ln_f.bias"] = normal((C,), LN_BIAS_STD)
    return params


def layer_norm(x, w, b):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # biased, as GPT-2
    return (x - mean) / torch.sqrt(var + LN_EPS) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def forward(params, tokens):
    """Returns logits over the real vocabulary, [B, T, vocab_size]."""
    C = CONFIG["n_embd"]
    H = CONFIG["n_head"]
    hd = C // H
    V = CONFIG["vocab_size"]
    b_, t_ = tokens.shape
    x = params["transformer.wte.weight"][tokens] + params["transformer.wpe.weight"][:t_]
    mask = torch.tril(torch.ones(t_, t_, dtype=torch.bool))
    for l in range(CONFIG["n_layer"]):
        p = f"transformer.h.{l}."
        h = layer_norm(x, params[p + "ln_1.weight"], params[p + "ln_1.bias"])
        qkv = h @ params[p + "attn.c_attn.weight"] + params[p + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=-1)
        q = q.view(b_, t_, H, hd).transpose(1, 2)
        k = k.view(b_, t_, H, hd).transpose(1, 2)
        v = v.view(b_, t_, H, hd).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        scores = scores.masked_fill(~mask, float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v
        y = y.transpose(1, 2).reshape(b_, t_, C)
        x = x + y @ params[p + "attn.c_proj.weight"] + params[p + "attn.c_proj.bias"]
        h = layer_norm(x, params[p + "ln_2.weight"], params[p + "ln_2.bias"])
        h = gelu_tanh(h @ params[p + "mlp.c_fc.weight"] + params[p + "mlp.c_fc.bias"])
        x = x + h @ params[p + "mlp.c_proj.weight"] + params[p + "mlp.c_proj.bias"]
    x = layer_norm(x, params["transformer.ln_f.weight"], params["transformer.ln_f.bias"])
    logits = x @ params["transformer.wte.weight"].t()  # [B, T, padded vocab]
    return logits[..., :V]  # padded columns never enter the softmax


def mean_loss(params, tokens, targets):
    logits = forward(params, tokens)
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1,
        reduction="mean")


def write_safetensors(path, tensors, metadata):
    """Minimal safetensors writer (the format is simple; no extra package needed)."""
    header = {"__metadata__": metadata}
    blobs = []
    offset = 0
    for name, array in tensors:
        array = np.ascontiguousarray(array)
        dtype = {np.dtype("float32"): "F32", np.dtype("int32"): "I32"}[array.dtype]
        data = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text.encode("utf-8"))
        for data in blobs:
            f.write(data)


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1234)
    V = CONFIG["vocab_size"]
    params = make_params(gen)
    names = list(params.keys())
    tokens = torch.randint(0, V, (B, T), generator=gen)
    targets = torch.randint(0, V, (B, T), generator=gen)
    for b, t in IGNORED_POSITIONS:
        targets[b, t] = -1

    leaves = {n: p.clone().requires_grad_(True) for n, p in params.items()}
    loss = mean_loss(leaves, tokens, targets)
    loss.backward()
    grads = {n: leaves[n].grad.detach().clone() for n in names}
    with torch.no_grad():
        logits_last = forward(params, tokens)[:, -1, :]

    # AdamW: torch's implementation, decay on 2-D weights only, global-norm clipping.
    train = {n: p.clone().requires_grad_(True) for n, p in params.items()}
    decay = [train[n] for n in names if train[n].dim() == 2]
    no_decay = [train[n] for n in names if train[n].dim() != 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": ADAMW["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=ADAMW["lr"], betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"])
    grad_norms, step_losses = [], []
    for _ in range(ADAMW["steps"]):
        opt.zero_grad()
        step_loss = mean_loss(train, tokens, targets)
        step_loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(list(train.values()), ADAMW["grad_clip"])
        assert norm.item() > ADAMW["grad_clip"], "clipping must be active in the fixture"
        grad_norms.append(norm.item())
        step_losses.append(step_loss.item())
        opt.step()
    Vp = padded_vocab(V)
    assert torch.all(train["transformer.wte.weight"][V:Vp] == 0), "padded rows must stay zero"

    f32 = lambda t: t.detach().to(torch.float32).numpy()
    tensors = [("tokens", tokens.to(torch.int32).numpy()),
               ("targets", targets.to(torch.int32).numpy()),
               ("loss", np.array([loss.item()], dtype=np.float32)),
               ("logits_last", f32(logits_last)),
               ("adamw.grad_norms", np.array(grad_norms, dtype=np.float32)),
               ("adamw.losses", np.array(step_losses, dtype=np.float32))]
    for n in names:
        tensors.append((n, f32(params[n])))
        tensors.append((n + ".grad", f32(grads[n])))
        tensors.append((n + ".after_3_steps", f32(train[n])))
    metadata = {
        "config": json.dumps(CONFIG),
        "batch": json.dumps({"B": B, "T": T, "ignore_index": -1}),
        "adamw": json.dumps(ADAMW),
        "loss_reduction": "mean over targets != -1; .grad tensors are of this mean",
        "generator": "tools/make_gpt2_fixture.py (float64 PyTorch, stored as float32)",
    }
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                       "gpt2_fixture.safetensors")
    write_safetensors(out, tensors, metadata)
    print(f"wrote {os.path.normpath(out)}: loss {loss.item():.6f}, grad norms {grad_norms}, "
          f"{os.path.getsize(out)} bytes")


if __name__ == "__main__":
    main()
