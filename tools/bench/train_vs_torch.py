#!/usr/bin/env python3
"""PyTorch 2.x side of tools/bench/train_vs_torch.sh.

Trains, on random tokens, the models tools/bench/train_vs_torch.lua trains in Tetra,
written the way a PyTorch user would write them (scaled_dot_product_attention, F.rms_norm,
fused AdamW):

  llama  vocab 4096, dim 256, 4 layers, 4 heads, ffn 768 (SwiGLU), RoPE, RMSNorm, untied
         head; batch 8, seq 256
  gpt2   GPT-2 124M: vocab 50257, dim 768, 12 layers, 12 heads, ffn 3072 (tanh GELU),
         LayerNorm, biases, learned positions (seq rows), tied head; batch 4, seq 64

AdamW (lr 3e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on 2-D weights, fused=True),
gradient clipping at 1.0. --mode compile wraps the model (forward + loss, and so its
backward) in torch.compile; the optimizer step stays eager. --precision bf16 runs forward
and backward under torch.autocast("cpu", bfloat16) with fp32 master weights, as Tetra's
train.precision=bf16 keeps them. The --warmup steps are untimed (they hold torch.compile's
compilation); then --steps timed steps, each from the forward to the optimizer's
zero_grad, loss.item() included.

Prints one JSON line. --describe prints torch's version and BLAS instead."""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

MODELS = {
    "llama": dict(vocab_size=4096, dim=256, n_layers=4, n_heads=4, ffn_hidden=768,
                  seq_len=256, norm_eps=1e-5, rope_theta=10000.0, batch=8),
    "gpt2": dict(vocab_size=50257, dim=768, n_layers=12, n_heads=12, ffn_hidden=3072,
                 seq_len=64, norm_eps=1e-5, batch=4),
}


# -- Llama --------------------------------------------------------------------------------

def rope_tables(seq_len, head_dim, theta):
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv)
    return angles.cos(), angles.sin()


def rope(x, cos, sin):
    """x (B, H, T, hd), rotate-half RoPE (as recipes/llama.lua)."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    return x * cos + torch.cat((-x2, x1), -1) * sin


class LlamaBlock(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["dim"]
        self.n_heads, self.eps = c["n_heads"], c["norm_eps"]
        self.attention_norm = torch.nn.Parameter(torch.ones(d))
        self.wq = torch.nn.Linear(d, d, bias=False)
        self.wk = torch.nn.Linear(d, d, bias=False)
        self.wv = torch.nn.Linear(d, d, bias=False)
        self.wo = torch.nn.Linear(d, d, bias=False)
        self.ffn_norm = torch.nn.Parameter(torch.ones(d))
        self.w1 = torch.nn.Linear(d, c["ffn_hidden"], bias=False)
        self.w2 = torch.nn.Linear(c["ffn_hidden"], d, bias=False)
        self.w3 = torch.nn.Linear(d, c["ffn_hidden"], bias=False)

    def forward(self, x, cos, sin):
        B, T, D = x.shape
        h = F.rms_norm(x, (D,), self.attention_norm, self.eps)
        q, k, v = (lin(h).view(B, T, self.n_heads, -1).transpose(1, 2)
                   for lin in (self.wq, self.wk, self.wv))
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(B, T, D))
        h = F.rms_norm(x, (D,), self.ffn_norm, self.eps)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.eps = c["norm_eps"]
        self.tok_embeddings = torch.nn.Embedding(c["vocab_size"], c["dim"])
        self.layers = torch.nn.ModuleList(LlamaBlock(c) for _ in range(c["n_layers"]))
        self.norm = torch.nn.Parameter(torch.ones(c["dim"]))
        self.output = torch.nn.Linear(c["dim"], c["vocab_size"], bias=False)
        cos, sin = rope_tables(c["seq_len"], c["dim"] // c["n_heads"], c["rope_theta"])
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        init_normal(self, c["n_layers"], ("wo.weight", "w2.weight"))

    def forward(self, ids, targets):
        T = ids.shape[1]
        x = self.tok_embeddings(ids)
        for layer in self.layers:
            x = layer(x, self.cos[:T], self.sin[:T])
        logits = self.output(F.rms_norm(x, (x.shape[-1],), self.norm, self.eps))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


# -- GPT-2 --------------------------------------------------------------------------------

class GPT2Block(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["dim"]
        self.n_heads = c["n_heads"]
        self.ln_1 = torch.nn.LayerNorm(d, eps=c["norm_eps"])
        self.wq = torch.nn.Linear(d, d)
        self.wk = torch.nn.Linear(d, d)
        self.wv = torch.nn.Linear(d, d)
        self.wo = torch.nn.Linear(d, d)
        self.ln_2 = torch.nn.LayerNorm(d, eps=c["norm_eps"])
        self.c_fc = torch.nn.Linear(d, c["ffn_hidden"])
        self.c_proj = torch.nn.Linear(c["ffn_hidden"], d)

    def forward(self, x):
        B, T, D = x.shape
        h = self.ln_1(x)
        q, k, v = (lin(h).view(B, T, self.n_heads, -1).transpose(1, 2)
                   for lin in (self.wq, self.wk, self.wv))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(B, T, D))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = torch.nn.Embedding(c["vocab_size"], c["dim"])
        self.wpe = torch.nn.Embedding(c["seq_len"], c["dim"])
        self.h = torch.nn.ModuleList(GPT2Block(c) for _ in range(c["n_layers"]))
        self.ln_f = torch.nn.LayerNorm(c["dim"], eps=c["norm_eps"])
        self.register_buffer("positions", torch.arange(c["seq_len"]), persistent=False)
        init_normal(self, c["n_layers"], ("wo.weight", "c_proj.weight"))

    def forward(self, ids, targets):
        x = self.wte(ids) + self.wpe(self.positions[:ids.shape[1]])
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)   # tied head
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def init_normal(model, n_layers, residual_outputs):
    """Normal(0, 0.02) for 2-D weights, 0.02/sqrt(2L) for the residual output projections,
    zero biases: the recipes' init."""
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            std = 0.02 / math.sqrt(2 * n_layers) if name.endswith(residual_outputs) else 0.02
            torch.nn.init.normal_(p, 0.0, std)
        elif name.endswith("bias"):
            torch.nn.init.zeros_(p)


# -- Benchmark ----------------------------------------------------------------------------

def describe():
    blas = [line.strip(" -") for line in torch.__config__.show().splitlines()
            if any(k in line for k in ("Math Kernel", "MKL-DNN", "oneDNN", "OpenBLAS",
                                       "CPU capability"))]
    print(f"torch {torch.__version__}: " + "; ".join(blas))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted(MODELS), default="llama")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--mode", choices=("eager", "compile"), default="eager")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--describe", action="store_true")
    args = ap.parse_args()
    if args.describe:
        describe()
        return

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    c = MODELS[args.model]
    model = (Llama if args.model == "llama" else GPT2)(c)
    params = sum(p.numel() for p in model.parameters())   # the tied wte counted once
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    forward = torch.compile(model) if args.mode == "compile" else model
    bf16 = args.precision == "bf16"
    batch, seq, vocab = c["batch"], c["seq_len"], c["vocab_size"]

    def step(i):
        g = torch.Generator().manual_seed(i)
        tokens = torch.randint(0, vocab, (batch, seq + 1), generator=g)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = forward(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    t0 = time.perf_counter()
    for i in range(args.warmup):
        step(i)
    warmup_s = time.perf_counter() - t0
    times = []
    for i in range(args.steps):
        t0 = time.perf_counter()
        loss = step(args.warmup + i)
        times.append(time.perf_counter() - t0)
    # The median step is the typical speed; the best step is the speed without
    # interference from other processes on a shared machine.
    times.sort()
    median, best = times[len(times) // 2], times[0]
    tokens = batch * seq
    print(json.dumps({"impl": "torch-" + args.mode, "model": args.model,
                      "precision": args.precision, "version": torch.__version__,
                      "threads": torch.get_num_threads(), "warmup": args.warmup,
                      "warmup_s": warmup_s, "steps": args.steps, "tokens_per_step": tokens,
                      "params": params, "step_time_s": median, "tokens_per_s": tokens / median,
                      "best_step_time_s": best, "best_tokens_per_s": tokens / best,
                      "last_loss": loss}))


if __name__ == "__main__":
    main()
