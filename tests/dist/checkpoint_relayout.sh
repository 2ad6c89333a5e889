#!/usr/bin/env bash
# A checkpoint loads into a different layout: the tiny Llama recipe runs with tensor parallelism
# on 2 ranks and saves at step 6 (each rank the slices it holds, index.json
# with the whole shapes and the offsets); the run then resumes from it on one process
# (every parameter assembled from both ranks' slices) and with pipeline parallelism on 2
# ranks (each stage reads its layers). Steps 7..12 must follow the uninterrupted
# single-process run within 1e-5 relative (loss and grad_norm): the layouts compute the
# same math in different orders.
# Usage: bash checkpoint_relayout.sh /path/to/tetra   (exit 77: skipped)
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
[ -f "$root/recipes/tiny.lua" ] || { echo "skipped: recipes/tiny.lua is missing"; exit 77; }
command -v mpirun >/dev/null || { echo "skipped: no mpirun"; exit 77; }
export OMP_NUM_THREADS=1
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
recipe="$root/recipes/tiny.lua"
steps=(--set train.steps=12)

run() {   # run NAME [mpirun -np N] tetra args...
  local name="$1"; shift
  if ! "$@" >"$work/$name.log" 2>&1; then
    echo "FAIL: the $name run failed:"; cat "$work/$name.log"; exit 1
  fi
}

run single "$tetra" run "$recipe" "${steps[@]}" --set log.metrics_file="$work/single.jsonl"
# 12 steps (the lr schedule depends on train.steps), saving at step 6.
run tp2 mpirun --oversubscribe -np 2 "$tetra" run "$recipe" "${steps[@]}" \
  --set parallel.tensor_parallel_size=2 --set checkpoint.dir="$work/ckpt" \
  --set checkpoint.every=6 --set log.metrics_file="$work/tp2.jsonl"
ck="$work/ckpt/step_000006"
[ -f "$ck/index.json" ] || { echo "FAIL: the TP=2 checkpoint has no index.json"; ls -R "$work/ckpt"; exit 1; }
run one "$tetra" run "$recipe" "${steps[@]}" --set checkpoint.resume="$ck" \
  --set log.metrics_file="$work/one.jsonl"
run pp2 mpirun --oversubscribe -np 2 "$tetra" run "$recipe" "${steps[@]}" \
  --set parallel.pipeline_parallel_size=2 --set checkpoint.resume="$ck" \
  --set log.metrics_file="$work/pp2.jsonl"

# "step":N,"loss":X,"lr":Y,"grad_norm":Z -> N X Z
values() { sed -E 's/.*"step":([0-9]+),"loss":([^,]+),"lr":[^,]+,"grad_norm":([^,]+),.*/\1 \2 \3/' "$1"; }
status=0
for layout in one pp2; do
  grep -q "resumed from $ck at step 6" "$work/$layout.log" ||
    { echo "FAIL: $layout: no 'resumed from' line:"; cat "$work/$layout.log"; exit 1; }
  if ! awk -v name="$layout" '
      NR == FNR { loss[$1] = $2; norm[$1] = $3; next }
      function rel(a, b) { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; return m > 0 ? d / m : d }
      $1 >= 7 {
        n++
        if (!($1 in loss)) { print name ": step " $1 " missing in the single run"; bad = 1; next }
        r = rel($2, loss[$1]); g = rel($3, norm[$1])
        printf "%s step %d loss %s vs %s (rel %.2e) grad_norm rel %.2e\n", name, $1, $2, loss[$1], r, g
        if (r > 1e-5 || g > 1e-5) bad = 1
      }
      END { if (n != 6) { print name ": expected steps 7..12, got " n; bad = 1 } exit bad }
    ' <(values "$work/single.jsonl") <(values "$work/$layout.jsonl"); then
    echo "FAIL: $layout after the TP=2 checkpoint departs from the single-process run"; status=1
  fi
done
[ "$status" = 0 ] && echo PASS
exit "$status"
