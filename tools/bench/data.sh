#!/usr/bin/env bash
# The data pipeline's speed next to what training consumes, measured in the same run
# (needs tools/setup: the fortunes corpus):
# the loader alone (BPE tokenization on 1 and 2 worker threads) reading JSONL from local
# disk and from an S3-compatible server on loopback (moto, tests/data/s3_server.py:
# every request signed and checked), then the tiny Llama recipe training on the same
# data (its tokens/s is what the loader must keep up with). Prints one JSON line per
# measurement and a ratio table: loader tokens/s over trainer tokens/s (> 1: the trainer
# never waits).
#   tools/bench/data.sh [path/to/tetra]     (needs tools/setup-python-refs: moto)
set -eu
root="$(cd "$(dirname "$0")/../.." && pwd)"
tetra="${1:-$root/build/tetra}"
py="$root/.deps/venv/bin/python3"
work="$(mktemp -d)"
server=""
trap '[ -n "$server" ] && kill $server 2>/dev/null; rm -rf "$work"' EXIT
echo "# OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive (tetra default)} cores=$(nproc)"
mkdir -p "$work/data"
# The corpus: every fortune of Debian's fortunes package (real English, a few MB), one
# JSONL document each, over 4 shards.
"$py" - "$work/data" <<'PY'
import glob, json, os, sys
docs = []
for path in sorted(glob.glob("/usr/share/games/fortunes/*")):
    if os.path.isdir(path) or "." in os.path.basename(path):
        continue
    text = open(path, encoding="utf-8", errors="replace").read()
    docs += [d.strip() for d in text.split("\n%\n") if d.strip()]
shards = [open(f"{sys.argv[1]}/part-{k}.jsonl", "w") for k in range(4)]
for i, d in enumerate(docs):
    shards[i % 4].write(json.dumps({"text": d}) + "\n")
PY
du -sh "$work/data" | sed 's/^/# corpus: /'
"$tetra" tokenizer train --vocab-size 2048 --out "$work/tok" "$work/data/part-0.jsonl" >/dev/null 2>&1
"$py" "$root/tests/data/s3_server.py" --dir "$work/data" --bucket corpus --env "$work/env.sh" \
  --faults "$work/faults.json" >"$work/server.log" 2>&1 &
server=$!
for _ in $(seq 120); do [ -f "$work/env.sh" ] && break; sleep 0.25; done
. "$work/env.sh"
out="$work/results.jsonl"
for src in "$work/data/*.jsonl" "s3://corpus/*.jsonl"; do
  for w in 1 2; do
    "$tetra" -e 'dofile(arg[1])' "$root/tools/bench/data_loader.lua" "$src" "$work/tok/tokenizer.json" $w 6 | tee -a "$out"
  done
done
OMP_NUM_THREADS=$(nproc) "$tetra" run "$root/recipes/tiny.lua" --set train.steps=12 --set train.warmup_steps=1 \
  --set model.vocab_size=2048 --set model.seq_len=256 --set train.batch_size=16 \
  --set data.input_path="$work/data/*.jsonl" --set data.tokenizer="$work/tok/tokenizer.json" \
  --set log.metrics_file="$work/train.jsonl" --set log.progress=false >/dev/null
"$py" - "$out" "$work/train.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
train = [json.loads(l) for l in open(sys.argv[2])][3:]
tps = statistics.median(r["tokens_per_s"] for r in train)
print(json.dumps({"trainer": "tiny llama (recipes/tiny.lua, seq 256, batch 16)", "tokens_per_s": round(tps)}))
print(f"{'source':8} {'workers':>7} {'loader tok/s':>13} {'per worker':>11} {'vs trainer':>10}")
for r in rows:
    print(f"{r['source']:8} {r['workers']:>7} {r['tokens_per_s']:>13,.0f} {r['tokens_per_s_per_worker']:>11,.0f} {r['tokens_per_s'] / tps:>9.1f}x")
PY
