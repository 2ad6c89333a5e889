#!/usr/bin/python3
"""PyTorch side of tools/bench/train_vs_torch.sh: trains the benchmark Llama (the model of
tools/torch_reference.py, op for op what recipes/llama.lua builds) on random tokens with
AdamW and prints one JSON line: tokens_per_s and step_time_s (median step),
best_tokens_per_s and best_step_time_s (fastest step), threads, steps.

Run by the shell script with the same OMP/OpenBLAS environment as Tetra."""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_reference import Llama  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=768)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = dict(vocab_size=args.vocab, dim=args.dim, n_layers=args.layers, n_heads=args.heads,
               n_kv_heads=args.heads, ffn_hidden=args.ffn, seq_len=args.seq, norm_eps=1e-5,
               rope_theta=10000.0, tie_embeddings=False)
    model = Llama(cfg)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8)

    def step(i):
        g = torch.Generator().manual_seed(i)
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
        loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    for i in range(args.warmup):
        step(i)
    times = []
    for i in range(args.steps):
        t0 = time.perf_counter()
        loss = step(args.warmup + i)
        times.append(time.perf_counter() - t0)
    # The median step is the typical speed; the best step is the speed without
    # interference from other processes on a shared machine.
    times.sort()
    median, best = times[len(times) // 2], times[0]
    tokens = args.batch * args.seq
    print(json.dumps({"impl": "pytorch", "version": torch.__version__,
                      "threads": torch.get_num_threads(), "steps": args.steps,
                      "step_time_s": median, "tokens_per_s": tokens / median,
                      "best_step_time_s": best, "best_tokens_per_s": tokens / best,
                      "last_loss": loss}))


if __name__ == "__main__":
    main()
