#!/usr/bin/env bash
# The streaming loader (tetra.data: BPE text, worker threads) under parallel layouts:
# each data-parallel rank reads and tokenizes only the streams that feed its rows, and
# the rows it gets are exactly its rows of the single process's global batch, so loss
# and grad_norm follow the single-process run (tools/compare_loss) with data parallelism
# alone and combined with tensor and pipeline parallelism. Then a checkpoint written on 2
# data-parallel ranks (one loader state per data-parallel rank) resumes on 1 and on 4:
# steps 7..12 must equal the uninterrupted single-process run.
# Usage: bash data_layouts.sh /path/to/tetra   (exit 77: skipped)
set -u
source "$(dirname "$0")/prelude.bash"
text=/usr/share/games/fortunes/computers
[ -f "$text" ] || { echo "FAIL: $text is missing (tools/setup installs the fortunes package)"; exit 1; }
"$tetra" tokenizer train --vocab-size 320 --out "$work/tok" "$text" >"$work/tok.log" 2>&1 ||
  { echo "FAIL: tokenizer training failed:"; cat "$work/tok.log"; exit 1; }
common=(--set data.mock=false --set data.input_path="$text"
        --set data.tokenizer="$work/tok/tokenizer.json" --set model.vocab_size=320
        --set train.steps=12 --set train.lr=3e-3 --set train.max_grad_norm=0.5
        --set train.gradient_accumulation_steps=2 --set train.sample_tokens=0)
status=0
for layout in "2 parallel.data_parallel_size=2" \
              "4 parallel.data_parallel_size=2 parallel.tensor_parallel_size=2" \
              "4 parallel.data_parallel_size=2 parallel.pipeline_parallel_size=2"; do
  set -- $layout
  np="$1"; shift
  args=(); for kv in "$@"; do args+=(--layout "$kv"); done
  if tools/compare_loss --tetra "$tetra" --np "$np" "${args[@]}" recipes/tiny.lua "${common[@]}" \
       >"$work/cmp.log" 2>&1; then
    echo "$*: $(tail -n 1 "$work/cmp.log")"
  else
    echo "FAIL: $*:"; tail -n 15 "$work/cmp.log"; status=1
  fi
done

# Resume: saved on dp 2 at step 6, resumed on 1 and on 4 ranks.
run() {   # run NAME NP settings...
  local name="$1" np="$2"; shift 2
  local cmd=("$tetra" run recipes/tiny.lua "${common[@]}" "$@" --set log.metrics_file="$work/$name.jsonl")
  [ "$np" -gt 1 ] && cmd=(mpirun --oversubscribe -np "$np" "${cmd[@]}")
  timeout -k 10 300 "${cmd[@]}" >"$work/$name.log" 2>&1 || { echo "FAIL: $name:"; tail -n 20 "$work/$name.log"; exit 1; }
}
run single 1
run dp2 2 --set parallel.data_parallel_size=2 --set checkpoint.dir="$work/ck" --set checkpoint.every=6
ck="$work/ck/step_000006"
ls "$ck"/loader_dp_*.bin >/dev/null 2>&1 || { echo "FAIL: no loader states in $ck"; ls "$ck"; exit 1; }
values() { sed -E 's/.*"step":([0-9]+),"loss":([^,]+),"lr":[^,]+,"grad_norm":([^,]+),.*/\1 \2 \3/' "$1"; }
for target in "1" "4 --set parallel.data_parallel_size=4"; do
  set -- $target
  np="$1"; shift
  run "resume_np$np" "$np" "$@" --set checkpoint.resume="$ck"
  if ! awk -v name="resume on $np" '
      NR == FNR { loss[$1] = $2; norm[$1] = $3; next }
      function rel(a, b) { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; return m > 0 ? d / m : d }
      $1 >= 7 { n++; r = rel($2, loss[$1]); g = rel($3, norm[$1]); if (r > w) w = r; if (g > wg) wg = g
                if (r > 1e-5 || g > 1e-5) bad = 1 }
      END { printf "%s: steps 7..12 worst loss rel %.2e, grad_norm rel %.2e\n", name, w, wg
            exit bad || n != 6 }' <(values "$work/single.jsonl") <(values "$work/resume_np$np.jsonl"); then
    echo "FAIL: resumed on $np ranks departs from the single-process run"; status=1
  fi
done
[ "$status" = 0 ] && echo PASS
exit "$status"
