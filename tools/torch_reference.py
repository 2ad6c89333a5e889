#!/usr/bin/python3
"""PyTorch reference for Tetra's model parity tests.

Run with Debian's PyTorch 1.13 (`/usr/bin/python3 tools/torch_reference.py`). For a tiny
Llama and a tiny GPT-2 it writes into tests/fixtures/:

  <name>.safetensors        initial weights (Tetra's parameter names) + the fixed batch
                            (`batch.input_ids`, `batch.targets`, int64); its __metadata__
                            holds the model and optimizer settings (`model.dim`,
                            `optim.lr` ...) and the expected results: `expected.loss`
                            (initial loss), `expected.losses` and `expected.grad_norms`
                            (comma-separated, one per AdamW step), `expected.params`
  <name>_grads.safetensors  the gradient of every parameter at the initial weights

The models here are written to match recipes/llama.lua and recipes/gpt2.lua op for op
(rotate-half RoPE, grouped-query attention where query head h reads kv head
h // (n_heads / n_kv_heads), tanh GELU, decoupled weight decay on 2-D weights only).
"""
import argparse
import json
import math
import os
import struct

import torch
import torch.nn.functional as F

# -- Tiny configurations (kept small: the fixtures are committed) --------------------------

LLAMA_TINY = dict(vocab_size=96, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=64,
                  seq_len=16, norm_eps=1e-5, rope_theta=10000.0, tie_embeddings=False)
GPT2_TINY = dict(vocab_size=96, dim=32, n_layers=2, n_heads=4, ffn_hidden=128, seq_len=16,
                 norm_eps=1e-5)
OPTIM = dict(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, max_grad_norm=0.65,
             steps=10)
BATCH_SIZE = 4
SEED = 1234


# -- Llama ----------------------------------------------------------------------------------

def rope_tables(seq_len, head_dim, theta):
    """cos, sin: (T, Dh) for rotate-half RoPE; angles computed in float64."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x, cos, sin):
    """x: (B, T, H, Dh); pairs (i, i + Dh/2) rotate by angle t * theta^(-2i/Dh)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[None, :, None, :] + rotated * sin[None, :, None, :]


def causal_attention(q, k, v):
    """q: (B, T, Hq, Dh), k, v: (B, T, Hkv, Dh) -> (B, T, Hq, Dh)."""
    n_rep = q.shape[2] // k.shape[2]
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    k = k.repeat_interleave(n_rep, dim=1)
    v = v.repeat_interleave(n_rep, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    T = q.shape[2]
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(mask, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2)


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class LlamaBlock(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        d, hd = c["dim"], c["dim"] // c["n_heads"]
        self.n_heads, self.n_kv_heads, self.head_dim = c["n_heads"], c["n_kv_heads"], hd
        self.attention_norm = RMSNorm(d, c["norm_eps"])
        self.attention = torch.nn.Module()
        self.attention.wq = torch.nn.Linear(d, c["n_heads"] * hd, bias=False)
        self.attention.wk = torch.nn.Linear(d, c["n_kv_heads"] * hd, bias=False)
        self.attention.wv = torch.nn.Linear(d, c["n_kv_heads"] * hd, bias=False)
        self.attention.wo = torch.nn.Linear(c["n_heads"] * hd, d, bias=False)
        self.ffn_norm = RMSNorm(d, c["norm_eps"])
        self.feed_forward = torch.nn.Module()
        self.feed_forward.w1 = torch.nn.Linear(d, c["ffn_hidden"], bias=False)
        self.feed_forward.w2 = torch.nn.Linear(c["ffn_hidden"], d, bias=False)
        self.feed_forward.w3 = torch.nn.Linear(d, c["ffn_hidden"], bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        a = self.attention
        h = self.attention_norm(x)
        q = apply_rope(a.wq(h).view(B, T, self.n_heads, self.head_dim), cos, sin)
        k = apply_rope(a.wk(h).view(B, T, self.n_kv_heads, self.head_dim), cos, sin)
        v = a.wv(h).view(B, T, self.n_kv_heads, self.head_dim)
        x = x + a.wo(causal_attention(q, k, v).reshape(B, T, -1))
        h = self.ffn_norm(x)
        f = self.feed_forward
        return x + f.w2(F.silu(f.w1(h)) * f.w3(h))


class Llama(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.tok_embeddings = torch.nn.Embedding(c["vocab_size"], c["dim"])
        self.layers = torch.nn.ModuleList(LlamaBlock(c) for _ in range(c["n_layers"]))
        self.norm = RMSNorm(c["dim"], c["norm_eps"])
        if not c.get("tie_embeddings"):
            self.output = torch.nn.Linear(c["dim"], c["vocab_size"], bias=False)
        cos, sin = rope_tables(c["seq_len"], c["dim"] // c["n_heads"], c["rope_theta"])
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.init_weights()

    def init_weights(self):
        """Normal(0, 0.02); residual output projections (wo, w2) scaled by 1/sqrt(2L)."""
        resid_std = 0.02 / math.sqrt(2 * self.c["n_layers"])
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue
            std = resid_std if name.endswith(("wo.weight", "w2.weight")) else 0.02
            torch.nn.init.normal_(p, 0.0, std)

    def forward(self, ids, targets):
        T = ids.shape[1]
        x = self.tok_embeddings(ids)
        for layer in self.layers:
            x = layer(x, self.cos[:T], self.sin[:T])
        x = self.norm(x)
        w = self.tok_embeddings.weight if self.c.get("tie_embeddings") else self.output.weight
        logits = x @ w.t()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# -- GPT-2 ----------------------------------------------------------------------------------

class GPT2Block(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["dim"]
        self.n_heads = c["n_heads"]
        self.ln_1 = torch.nn.LayerNorm(d, eps=c["norm_eps"])
        self.attn = torch.nn.Module()
        for name in ("wq", "wk", "wv", "wo"):
            setattr(self.attn, name, torch.nn.Linear(d, d))
        self.ln_2 = torch.nn.LayerNorm(d, eps=c["norm_eps"])
        self.mlp = torch.nn.Module()
        self.mlp.c_fc = torch.nn.Linear(d, c["ffn_hidden"])
        self.mlp.c_proj = torch.nn.Linear(c["ffn_hidden"], d)

    def forward(self, x):
        B, T, D = x.shape
        a = self.attn
        h = self.ln_1(x)
        q, k, v = (lin(h).view(B, T, self.n_heads, D // self.n_heads)
                   for lin in (a.wq, a.wk, a.wv))
        x = x + a.wo(causal_attention(q, k, v).reshape(B, T, D))
        h = self.ln_2(x)
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(h), approximate="tanh"))


class GPT2(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.wte = torch.nn.Embedding(c["vocab_size"], c["dim"])
        self.wpe = torch.nn.Embedding(c["seq_len"], c["dim"])
        self.h = torch.nn.ModuleList(GPT2Block(c) for _ in range(c["n_layers"]))
        self.ln_f = torch.nn.LayerNorm(c["dim"], eps=c["norm_eps"])
        resid_std = 0.02 / math.sqrt(2 * c["n_layers"])
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = resid_std if name.endswith(("wo.weight", "c_proj.weight")) else 0.02
                torch.nn.init.normal_(p, 0.0, std)

    def forward(self, ids, targets):
        T = ids.shape[1]
        x = self.wte(ids) + self.wpe(torch.arange(T))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# -- Training and fixture writing ------------------------------------------------------------

def adamw(model, o):
    """AdamW with weight decay on 2-D weights (matrices, embeddings) only."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"])


def perturb_norms_and_biases(model, gen):
    """The default init leaves norm weights at 1 and biases at 0, where some bugs hide."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                # 1-D weights are norm scales (default 1); 1-D biases default to 0.
                base = 1.0 if name.endswith("weight") else 0.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=gen))


def save_safetensors(path, tensors, metadata=None):
    """Minimal safetensors writer: header length (u64 LE), JSON header, raw data."""
    dtypes = {torch.float32: "F32", torch.int64: "I64", torch.int32: "I32"}
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.detach().contiguous().numpy().tobytes()
        header[name] = {"dtype": dtypes[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def write_fixture(outdir, name, model_cls, config):
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED + 1)
    model = model_cls(config)
    perturb_norms_and_biases(model, gen)
    tokens = torch.randint(0, config["vocab_size"], (BATCH_SIZE, config["seq_len"] + 1),
                           generator=gen)
    ids, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    weights["batch.input_ids"] = ids
    weights["batch.targets"] = targets

    loss = model(ids, targets)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    save_safetensors(os.path.join(outdir, name + "_grads.safetensors"), grads)
    initial_loss = loss.item()

    model.zero_grad(set_to_none=True)
    opt = adamw(model, OPTIM)
    losses, grad_norms = [], []
    for _ in range(OPTIM["steps"]):
        loss = model(ids, targets)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), OPTIM["max_grad_norm"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        grad_norms.append(norm.item())

    meta = {"torch_version": torch.__version__, "batch_size": str(BATCH_SIZE),
            "seed": str(SEED), "expected.loss": repr(initial_loss),
            "expected.losses": ",".join(repr(x) for x in losses),
            "expected.grad_norms": ",".join(repr(x) for x in grad_norms),
            "expected.params": ",".join(n for n, _ in model.named_parameters())}
    meta.update({"model." + k: str(v).lower() if isinstance(v, bool) else repr(v)
                 for k, v in config.items()})
    meta.update({"optim." + k: repr(v) for k, v in OPTIM.items()})
    save_safetensors(os.path.join(outdir, name + ".safetensors"), weights, meta)
    print(f"{name}: loss {initial_loss:.6f} -> {losses[-1]:.6f} after {len(losses)} steps")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    write_fixture(args.out, "llama_tiny", Llama, LLAMA_TINY)
    write_fixture(args.out, "gpt2_tiny", GPT2, GPT2_TINY)


if __name__ == "__main__":
    main()
