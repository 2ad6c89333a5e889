"""transformers' side of tests/cli/hf_convert.sh (run with .deps/venv-hf/bin/python3).

Each command takes its arguments once per job, repeated; "-" leaves an optional one out;
"+" starts the next command of the same run (tokens A 16 97 1 + random llama B -).

  tokens  OUT.safetensors T VOCAB SEED       random "tokens" (3, T + 1) int64
  compare HF_DIR TOKENS TETRA_OUT            from_pretrained(HF_DIR), logits and loss on
                                             TOKENS against Tetra's (TETRA_OUT); prints the
                                             max relative errors; exits 1 past 1e-4
  random  llama|gpt2|llama-tied|qwen2 OUT SHARD|-
                                             a randomly initialised model saved by
                                             save_pretrained (safetensors; sharded at
                                             SHARD, e.g. 20KB)
  same    A B                                every tensor of A equals B's bit for bit (A, B:
                                             safetensors files or folders of them)
  meta    HF_DIR META_DIR N_HEADS N_KV       META_DIR's q/k rows are HF_DIR's in Meta's
                                             interleaved order (HF's conversion permute)
  edit    FILE drop|add|cast NAME DTYPE|-    a damaged copy for the bad-input checks
  cast    HF_DIR OUT bfloat16|float16        the model saved again in a narrower dtype
"""
import glob
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers.utils import logging

logging.disable_progress_bar()

TOL = 1e-4


def tokens(out, t, vocab, seed):
    g = torch.Generator().manual_seed(int(seed))
    save_file({"tokens": torch.randint(0, int(vocab), (3, int(t) + 1), generator=g)}, out)


def compare(hf_dir, tokens_path, tetra_out):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()
    seq = load_file(tokens_path)["tokens"]
    with torch.no_grad():
        logits = model(input_ids=seq[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             seq[:, 1:].reshape(-1))
    mine = load_file(tetra_out)
    rel_logits = ((mine["logits"] - logits).abs().max() / logits.abs().max()).item()
    rel_loss = abs(mine["loss"].item() - loss.item()) / abs(loss.item())
    print(f"{type(model).__name__}: hf loss {loss.item():.9g}, tetra loss "
          f"{mine['loss'].item():.9g}, max relative error: logits {rel_logits:.3g}, "
          f"loss {rel_loss:.3g}")
    if not (rel_logits <= TOL and rel_loss <= TOL):
        sys.exit(f"FAIL: transformers and Tetra differ beyond {TOL}")


def random_model(kind, out, shard=None):
    from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                              Qwen2Config, Qwen2ForCausalLM)
    torch.manual_seed(7)
    if kind == "gpt2":
        cfg = GPT2Config(vocab_size=97, n_positions=24, n_embd=40, n_layer=2, n_head=5,
                         n_inner=72, layer_norm_epsilon=1e-4)
        model = GPT2LMHeadModel(cfg)
    elif kind == "qwen2":
        cfg = Qwen2Config(vocab_size=97, hidden_size=48, intermediate_size=70,
                          num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                          max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=20000.0)
        model = Qwen2ForCausalLM(cfg)
    else:
        cfg = LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=70,
                          num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                          max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=5000.0,
                          tie_word_embeddings=kind == "llama-tied")
        model = LlamaForCausalLM(cfg)
    # Norm weights and biases (Qwen2's q, k, v ones too) away from their 1 / 0 init, so a
    # swapped or dropped one shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    kw = {"safe_serialization": True}
    if shard:
        kw["max_shard_size"] = shard
    model.save_pretrained(out, **kw)


def same(a, b):
    ta, tb = [load_folder(x) if os.path.isdir(x) else load_file(x) for x in (a, b)]
    if sorted(ta) != sorted(tb):
        sys.exit(f"FAIL: {a} and {b} hold different tensors: {sorted(set(ta) ^ set(tb))}")
    for k in ta:
        if ta[k].dtype != tb[k].dtype or ta[k].shape != tb[k].shape or \
           ta[k].numpy().tobytes() != tb[k].numpy().tobytes():
            sys.exit(f"FAIL: tensor {k} differs between {a} and {b}")
    print(f"{len(ta)} tensors bit-identical")


def load_folder(path):
    out = {}
    for f in glob.glob(path + "/*.safetensors"):
        out.update(load_file(f))
    return out


def meta(hf_dir, meta_dir, n_heads, n_kv):
    # transformers' convert_llama_weights_to_hf permutes Meta's rows into rotate-half
    # order with view(h, hd/2, 2, dim).transpose(1, 2); Meta's order is its inverse.
    hf, me = load_folder(hf_dir), load_folder(meta_dir)
    checked = 0
    for k, w in hf.items():
        heads = int(n_heads) if "q_proj" in k else int(n_kv) if "k_proj" in k else None
        if heads is None:
            assert torch.equal(w, me[k]), k
            continue
        rows, dim = w.shape[0], w.shape[1] if w.dim() == 2 else 1   # a weight or a bias
        to_hf = me[k].reshape(heads, rows // heads // 2, 2, dim).transpose(1, 2).reshape(w.shape)
        if not torch.equal(to_hf, w) or torch.equal(me[k], w):
            sys.exit(f"FAIL: {k} in {meta_dir} is not the Meta-order permutation of {hf_dir}'s")
        checked += 1
    print(f"{checked} q/k projection tensors in Meta order")


def edit(path, what, name, dtype=None):
    """Rewrites safetensors file `path` with tensor `name` dropped, added (a copy of the
    first tensor), or cast to `dtype` (float64, int8, bfloat16, float16)."""
    t = load_file(path)
    if what == "drop":
        del t[name]
    elif what == "add":
        t[name] = next(iter(t.values())).clone()
    else:
        t[name] = t[name].to(getattr(torch, dtype))
    save_file(t, path, metadata={"format": "pt"})


def cast_model(src, out, dtype):
    """A folder's model saved again in `dtype` (bfloat16 or float16)."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(src, torch_dtype=getattr(torch, dtype))
    model.save_pretrained(out, safe_serialization=True)


# Each command takes its arguments repeated, once per job; "+" starts another command
# (one Python start-up for all: importing torch takes seconds).
COMMANDS = {"tokens": (tokens, 4), "compare": (compare, 3), "random": (random_model, 3),
            "same": (same, 2), "meta": (meta, 4), "edit": (edit, 4), "cast": (cast_model, 3)}


def main(argv):
    commands = [[]]
    for a in argv:
        if a == "+":
            commands.append([])
        else:
            commands[-1].append(a)
    for cmd in commands:
        fn, n = COMMANDS[cmd[0]]
        args = cmd[1:]
        if not args or len(args) % n:
            sys.exit(f"{cmd[0]} takes its arguments in groups of {n}")
        for i in range(0, len(args), n):
            fn(*[a for a in args[i:i + n] if a != "-"])


if __name__ == "__main__":
    main(sys.argv[1:])
