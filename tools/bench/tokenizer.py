#!/usr/bin/env python3
"""Tokenizer benchmarks: Tetra against tiktoken, Hugging Face tokenizers and sentencepiece.

    tools/bench/tokenizer.py --tetra BUILD/tt_tokenizer_driver [--train-mb 100] [--vocab 32000]

(--tetra takes any command with the arguments of `tetra tokenizer`, e.g. "build/tetra
tokenizer".) Corpus: the King James Bible (Debian bible-kjv, through `bible -f`) and the
Debian fortune files. Encoding is single-threaded everywhere (taskset to one CPU,
RAYON_NUM_THREADS=1), whole text at once (tokenizers: encode_batch of the lines), best of 3, Python objects built before timing:
  1. GPT-2's vocabulary: Tetra vs tiktoken
  2. a 32k vocabulary trained by tokenizers on the corpus: Tetra vs tokenizers vs tiktoken
     (the same ranks), and sentencepiece BPE trained with the same size on the same corpus
     (Debian's python3-sentencepiece, run with /usr/bin/python3, line by line)
  3. training 32k-vocab BPE on --train-mb MB (the corpus repeated) with 2 threads:
     `tetra tokenizer train` vs tokenizers' BpeTrainer.
Prints a table with MB/s and ratios. Needs tools/setup-python-refs.
"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def corpus(work):
    path = os.path.join(work, "corpus.txt")
    parts = []
    try:
        parts.append(subprocess.run(["bible", "-f", "gen1:1-rev22:21"], capture_output=True,
                                    timeout=300).stdout)
    except (OSError, subprocess.TimeoutExpired):
        pass
    for f in sorted(glob.glob("/usr/share/games/fortunes/*")):
        if "." in os.path.basename(f) and not f.endswith(".u8"):
            continue
        with open(f, "rb") as fh:
            parts.append(fh.read())
    data = b"".join(parts)
    if len(data) < 1_000_000:
        sys.exit("corpus too small: install bible-kjv and fortunes")
    with open(path, "wb") as fh:
        fh.write(data)
    return path, data


def best_of(fn, n=3):
    best = 1e30
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def tetra_mbps(cmd, tok_args, path):
    out = subprocess.run(["taskset", "-c", "0"] + cmd + ["bench"] + tok_args + ["--repeat", "3", path],
                         capture_output=True, text=True, check=True).stdout
    return float(out.split()[0]), int(out.split()[2])


def sentencepiece_mbps(work, path, vocab, nbytes):
    script = f"""
import sentencepiece as spm, time
spm.SentencePieceTrainer.train(input={path!r}, model_prefix={os.path.join(work, 'sp')!r},
    vocab_size={vocab}, model_type='bpe', byte_fallback=True, num_threads=2,
    input_sentence_size=2000000, shuffle_input_sentence=True, minloglevel=2)
sp = spm.SentencePieceProcessor(model_file={os.path.join(work, 'sp.model')!r})
lines = open({path!r}, encoding='utf-8', errors='replace').read().split('\\n')
best = 1e30
for _ in range(2):
    t0 = time.perf_counter()
    n = 0
    for line in lines:
        n += len(sp.encode(line))
    best = min(best, time.perf_counter() - t0)
print({nbytes} / 1e6 / best, n)
"""
    res = subprocess.run(["taskset", "-c", "0", "/usr/bin/python3", "-c", script], capture_output=True,
                         text=True)
    if res.returncode != 0:
        print("sentencepiece: skipped (" + res.stderr.strip().splitlines()[-1] + ")")
        return None, None
    mbps, n = res.stdout.split()
    return float(mbps), int(n)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tetra", required=True)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--train-mb", type=float, default=100)
    ap.add_argument("--skip-train", action="store_true")
    args = ap.parse_args()
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.sched_setaffinity(0, {0})
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    cmd = args.tetra.split()
    rows = []
    with tempfile.TemporaryDirectory() as work:
        path, data = corpus(work)
        text = data.decode("utf-8", "replace")
        mb = len(data) / 1e6
        print(f"corpus: {mb:.1f} MB (KJV + fortunes)")

        # 1. GPT-2 vocabulary.
        gpt2 = glob.glob(os.path.join(ROOT, ".deps", "**", "gpt2.tiktoken"), recursive=True)
        if gpt2:
            enc = tiktoken.Encoding("gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=load_tiktoken_bpe(gpt2[0]),
                                    special_tokens={"<|endoftext|>": 50256})
            t = best_of(lambda: enc.encode_ordinary(text))
            tm, tn = tetra_mbps(cmd, ["--tokenizer", gpt2[0]], path)
            n_ref = len(enc.encode_ordinary(text))
            rows.append(("gpt2", "tetra", tm, tn))
            rows.append(("gpt2", "tiktoken", mb / t, n_ref))

        # 2. A vocabulary trained by tokenizers on the corpus.
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=args.vocab, special_tokens=["<|endoftext|>"],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
        tok.train([path], trainer)
        tj = os.path.join(work, "hf.json")
        tok.save(tj)
        # tokenizers is far slower on one multi-megabyte string than on lines: give it lines.
        lines = text.split("\n")
        t = best_of(lambda: tok.encode_batch(lines))
        rows.append((f"hf-{args.vocab}", "tokenizers", mb / t, sum(len(e.ids) for e in tok.encode_batch(lines))))
        tm, tn = tetra_mbps(cmd, ["--tokenizer", tj], path)
        rows.append((f"hf-{args.vocab}", "tetra", tm, tn))
        byte_dec = {}
        bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
        cs, k = bs[:], 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + k)
                k += 1
        byte_dec = {chr(c): b for b, c in zip(bs, cs)}
        ranks = {bytes(byte_dec[ch] for ch in s): i for s, i in tok.get_vocab().items()
                 if s != "<|endoftext|>"}
        enc2 = tiktoken.Encoding("hf", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={})
        t = best_of(lambda: enc2.encode_ordinary(text))
        rows.append((f"hf-{args.vocab}", "tiktoken", mb / t, len(enc2.encode_ordinary(text))))
        sm, sn = sentencepiece_mbps(work, path, args.vocab, len(data))
        if sm:
            rows.append((f"spm-bpe-{args.vocab}", "sentencepiece", sm, sn))

        print(f"\n{'vocabulary':<14} {'encoder':<14} {'MB/s':>8} {'ids':>10} {'tetra ×':>8}")
        tetra_by_vocab = {v: m for v, e, m, _ in rows if e == "tetra"}
        for v, e, m, n in rows:
            ref = tetra_by_vocab.get(v, tetra_by_vocab.get(f"hf-{args.vocab}"))
            print(f"{v:<14} {e:<14} {m:8.2f} {n:10d} {ref / m:8.2f}")

        # 3. Training time.
        if not args.skip_train:
            big = os.path.join(work, "train.txt")
            reps = max(1, int(args.train_mb * 1e6 / len(data) + 0.5))
            with open(big, "wb") as fh:
                for _ in range(reps):
                    fh.write(data)
            size = os.path.getsize(big) / 1e6
            os.sched_setaffinity(0, {0, 1})
            os.environ["RAYON_NUM_THREADS"] = "2"
            t0 = time.perf_counter()
            subprocess.run(["taskset", "-c", "0,1"] + cmd + ["train", "--vocab-size", str(args.vocab),
                            "--threads", "2", "--out", os.path.join(work, "tt"), big], check=True,
                           capture_output=True)
            tt = time.perf_counter() - t0
            script = f"""
import time
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tr = trainers.BpeTrainer(vocab_size={args.vocab}, special_tokens=["<|endoftext|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
t0 = time.perf_counter(); tok.train([{big!r}], tr); print(time.perf_counter() - t0)
"""
            t0 = time.perf_counter()
            res = subprocess.run(["taskset", "-c", "0,1", sys.executable, "-c", script], check=True,
                                 capture_output=True, text=True)
            th = time.perf_counter() - t0
            print(f"\ntraining {args.vocab} vocabulary on {size:.0f} MB, 2 threads:")
            print(f"  tetra tokenizer train   {tt:7.1f} s")
            print(f"  tokenizers BpeTrainer   {th:7.1f} s  (train() alone {float(res.stdout):.1f} s)")
            print(f"  ratio (tokenizers / tetra) {th / tt:.2f}")


if __name__ == "__main__":
    main()
