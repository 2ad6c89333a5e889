#!/usr/bin/env bash
# What each parallel dimension costs: one fixed small Llama (recipes/tiny.lua at dim 256,
# 4 layers, 8 heads / 4 KV heads, vocab 4096, seq 128, global batch 8 as 2 micro-batches)
# trained for the same steps under each layout: 1 process, dp2, tp2, tp2 + sequence
# parallelism, pp2, cp2, dp2 + ZeRO-1, tp2xpp2 (4 ranks), tp2xcp2xdp2 (8 ranks) and, with
# --with-16, tp2xcp2xdp2xpp2 (16 ranks). Every run writes log.metrics_file (rank 0's view,
# one line per optimizer step); the first 2 steps are warm-up and the table shows medians of
# the rest:
#   step ms      median step_time_s
#   tokens/s     median tokens_per_s: the global batch's tokens over the step time
#   x 1proc      tokens/s over the 1-process run with OMP_NUM_THREADS=1 from this same
#                invocation (a rank's share of one core, the same as every multi-rank run)
#   ideal        the best that ratio could be here: min(ranks x threads, cores)
#   comm ms / %  median exposed_comm_s and its share of the step: time rank 0 sat blocked
#                on communication that computation did not hide, pipeline bubbles included
#   p+o MB       rank 0's parameter + optimizer-state bytes (10^6), showing what TP/PP split
#                and ZeRO-1 shards; grads MB is beside it
#   loss         the last step's loss: every layout should land near the 1-process one
# Every multi-rank run gives each rank OMP_NUM_THREADS=1, so the ideal "x 1proc" is
# min(ranks, cores): with a core per rank (2 ranks on 2 cores) the shortfall from it is the
# dimension's cost. With more ranks than cores the ranks are oversubscribed (time-shared),
# so those rows measure the overhead each dimension adds (communication, bubbles, smaller
# matmuls, scheduling), not the speedup it would give with a core or GPU per rank; their
# comm column also counts the time a rank waits for a peer that is not running.
#   tools/bench/layouts.sh [--steps N] [--tetra PATH] [--quick] [--with-16]
#                          [--timeout S] [--keep] [--set key=value ...]
#   --steps N    optimizer steps per run (default 10; at least 3, the first 2 are warm-up)
#   --quick      6 steps and one layout per dimension (1 process, dp2, tp2, pp2, cp2)
#   --with-16    also the 16-rank tp2xcp2xdp2xpp2 layout
#   --timeout S  kill a run after S seconds (default 300) and count it as failed
#   --keep       keep the run directory (metrics + logs) instead of removing it
#   --set k=v    passed to every run, after the model settings (so it can override them)
# A failed run prints a line naming the layout and the tail of its log; the others still
# run, the table marks it FAILED, and the script exits 1.
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
tetra="$root/build/tetra"
steps="" quick=0 with16=0 timeout_s=300 keep=0
extra=()
die() { echo "layouts.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) [ $# -ge 2 ] || die "--steps needs a value"; steps="$2"; shift 2 ;;
    --tetra) [ $# -ge 2 ] || die "--tetra needs a path"; tetra="$2"; shift 2 ;;
    --quick) quick=1; shift ;;
    --with-16) with16=1; shift ;;
    --timeout) [ $# -ge 2 ] || die "--timeout needs seconds"; timeout_s="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    --set) [ $# -ge 2 ] || die "--set needs key=value"; extra+=(--set "$2"); shift 2 ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[ -n "$steps" ] || { [ $quick = 1 ] && steps=6 || steps=10; }
case "$steps" in ''|*[!0-9]*) die "--steps must be a whole number" ;; esac
[ "$steps" -ge 3 ] || die "--steps must be at least 3 (2 warm-up steps are skipped)"
[ -x "$tetra" ] || die "no tetra executable at $tetra (build it: cmake --build build)"
command -v mpirun >/dev/null || die "mpirun not found (Open MPI is needed for the multi-rank layouts)"

cores=$(nproc)
work=$(mktemp -d "${TMPDIR:-/tmp}/tetra-layouts.XXXXXX")
[ $keep = 1 ] || trap 'rm -rf "$work"' EXIT

model=(--set model.dim=256 --set model.n_layers=4 --set model.n_heads=8
       --set model.n_kv_heads=4 --set model.ffn_hidden=768 --set model.vocab_size=4096
       --set model.seq_len=128 --set train.batch_size=8
       --set train.gradient_accumulation_steps=2 --set train.steps="$steps"
       --set train.warmup_steps=1 --set log.progress=false)

# name | ranks | OMP_NUM_THREADS per rank | parallel.* settings
layouts=("1proc-omp1|1|1|")
[ "$cores" -gt 1 ] && layouts+=("1proc-omp$cores|1|$cores|")
if [ $quick = 1 ]; then
  layouts+=("dp2|2|1|data_parallel_size=2"
            "tp2|2|1|tensor_parallel_size=2"
            "pp2|2|1|pipeline_parallel_size=2"
            "cp2|2|1|context_parallel_size=2")
else
  layouts+=("dp2|2|1|data_parallel_size=2"
            "tp2|2|1|tensor_parallel_size=2"
            "tp2+sp|2|1|tensor_parallel_size=2 sequence_parallel=true"
            "pp2|2|1|pipeline_parallel_size=2"
            "cp2|2|1|context_parallel_size=2"
            "dp2+zero1|2|1|data_parallel_size=2 zero_stage=1"
            "tp2xpp2|4|1|tensor_parallel_size=2 pipeline_parallel_size=2"
            "tp2xcp2xdp2|8|1|tensor_parallel_size=2 context_parallel_size=2 data_parallel_size=2")
fi
[ $with16 = 1 ] && layouts+=("tp2xcp2xdp2xpp2|16|1|tensor_parallel_size=2 context_parallel_size=2 data_parallel_size=2 pipeline_parallel_size=2")

commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ "$commit" != unknown ] && [ -n "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  commit="$commit (+ uncommitted changes)"
fi
echo "# tetra layouts benchmark  $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
echo "# tetra $tetra, commit $commit"
echo "# load average before the runs: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)" \
     "(other work on the machine skews every row)"
echo "# nproc $cores; OMP_NUM_THREADS=1 per rank for every multi-rank run; 1-process baseline with" \
     "OMP_NUM_THREADS=1$([ "$cores" -gt 1 ] && echo " and =$cores")"
echo "# OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE-(unset)}  OMP_WAIT_POLICY=${OMP_WAIT_POLICY-(unset)}" \
     " OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS-(unset)}  (as inherited, not changed here)"
echo "# model: recipes/tiny.lua dim 256, 4 layers, 8 heads / 4 KV, ffn 768, vocab 4096, seq 128;" \
     "batch 8 = 2 micro-batches; $steps steps, medians of steps 3..$steps${extra[*]:+; extra: ${extra[*]}}"
echo "# ranks beyond the $cores cores are oversubscribed: multi-rank rows measure overheads, not speedups"

# Medians over steps > 2 of one metrics file, and the last line's sizes and loss:
# "n step_s tok_s comm_s param_b grad_b opt_b loss".
summarize() {
  awk '
    function field(k,   m) {
      if (!match($0, "\"" k "\":[^,}]*")) return ""
      m = substr($0, RSTART, RLENGTH); sub(/^[^:]*:/, "", m); return m
    }
    function median(a, n,   i, j, v) {
      for (i = 2; i <= n; i++) { v = a[i]; for (j = i - 1; j >= 1 && a[j] > v; j--) a[j + 1] = a[j]; a[j + 1] = v }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    /^\{/ {
      last_loss = field("loss"); pb = field("param_bytes"); gb = field("grad_bytes")
      ob = field("optimizer_bytes")
      if (field("step") + 0 <= 2) next
      n++; st[n] = field("step_time_s") + 0; tp[n] = field("tokens_per_s") + 0
      ec[n] = field("exposed_comm_s") + 0
    }
    END {
      if (n == 0) { print 0; exit }
      printf "%d %.6f %.3f %.6f %s %s %s %s\n", n, median(st, n), median(tp, n), median(ec, n),
        pb == "" ? "nan" : pb, gb == "" ? "nan" : gb, ob == "" ? "nan" : ob, last_loss
    }' "$1"
}

failed=()
results=()
for spec in "${layouts[@]}"; do
  IFS='|' read -r name ranks threads sets <<<"$spec"
  par=()
  for kv in $sets; do par+=(--set "parallel.$kv"); done
  metrics="$work/$name.jsonl" log="$work/$name.log"
  rm -f "$metrics"
  args=(run "$root/recipes/tiny.lua" "${model[@]}" "${par[@]}" "${extra[@]}"
        --set log.metrics_file="$metrics")
  printf '# running %-16s %2d rank(s), OMP_NUM_THREADS=%s ... ' "$name" "$ranks" "$threads" >&2
  t0=$(date +%s.%N)
  if [ "$ranks" = 1 ]; then
    OMP_NUM_THREADS=$threads timeout "$timeout_s" "$tetra" "${args[@]}" >"$log" 2>&1
  else
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout "$timeout_s" \
      mpirun --oversubscribe --bind-to none -np "$ranks" -x OMP_NUM_THREADS="$threads" \
      "$tetra" "${args[@]}" >"$log" 2>&1
  fi
  rc=$?
  wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  got=0
  [ -f "$metrics" ] && got=$(grep -c '^{' "$metrics")
  if [ $rc -ne 0 ] || [ "$got" -lt "$steps" ]; then
    why="exit status $rc"; [ $rc = 124 ] && why="timed out after ${timeout_s}s"
    [ $rc = 0 ] && why="only $got of $steps steps in the metrics file"
    echo "FAILED" >&2
    echo "layouts.sh: layout $name ($ranks ranks) failed: $why; last 25 lines of its log:" >&2
    tail -n 25 "$log" | sed 's/^/  | /' >&2
    failed+=("$name")
    results+=("$name|$ranks|$threads|FAILED|$wall")
    continue
  fi
  echo "${wall}s" >&2
  results+=("$name|$ranks|$threads|$(summarize "$metrics")|$wall")
done

echo
printf '%s\n' "${results[@]}" | awk -F'|' -v cores="$cores" '
  {
    name[NR] = $1; ranks[NR] = $2; thr[NR] = $3; stats[NR] = $4; wall[NR] = $5
    if ($1 == "1proc-omp1" && $4 != "FAILED") { split($4, s, " "); base = s[3] }
  }
  END {
    fmt = "%-17s %5s %4s %9s %9s %8s %6s %8s %6s %8s %8s %8s %7s\n"
    printf fmt, "layout", "ranks", "omp", "step ms", "tokens/s", "x 1proc", "ideal", "comm ms", "comm%",
      "p+o MB", "grads MB", "loss", "wall s"
    for (i = 1; i <= NR; i++) {
      if (stats[i] == "FAILED") {
        printf fmt, name[i], ranks[i], thr[i], "FAILED", "-", "-", "-", "-", "-", "-", "-", "-", wall[i]
        continue
      }
      split(stats[i], s, " ")
      ratio = base > 0 ? sprintf("%.2f", s[3] / base) : "-"
      cpus = ranks[i] * thr[i]; ideal = sprintf("%.2f", cpus < cores ? cpus : cores)
      pct = s[2] > 0 ? sprintf("%.0f%%", 100 * s[4] / s[2]) : "-"
      po = (s[5] == "nan" || s[7] == "nan") ? "-" : sprintf("%.2f", (s[5] + s[7]) / 1e6)
      gm = s[6] == "nan" ? "-" : sprintf("%.2f", s[6] / 1e6)
      printf fmt, name[i], ranks[i], thr[i], sprintf("%.1f", 1000 * s[2]), sprintf("%.0f", s[3]),
        ratio, ideal, sprintf("%.1f", 1000 * s[4]), pct, po, gm, sprintf("%.4f", s[8]), wall[i]
    }
    print ""
    print "# x 1proc: tokens/s over the 1proc-omp1 row (1 process, OMP_NUM_THREADS=1); ideal: min(ranks x omp, " cores " cores); the 1proc-omp" cores \
      " row is the same process using all " cores " cores, for reference"
    print "# comm: rank 0 blocked on communication (pipeline bubbles included; when oversubscribed, also peers waiting for a core), median per step and % of the step"
    print "# wall s: the whole run, startup and warm-up steps included"
  }'

if [ ${#failed[@]} -gt 0 ]; then
  echo "layouts.sh: ${#failed[@]} layout(s) failed: ${failed[*]}" >&2
  [ $keep = 1 ] && echo "layouts.sh: logs and metrics kept in $work" >&2
  exit 1
fi
[ $keep = 1 ] && echo "# logs and metrics kept in $work"
exit 0
