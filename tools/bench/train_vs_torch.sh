#!/usr/bin/env bash
# Tetra against PyTorch 2.x (the PyPI wheel) training on the CPU: Tetra, PyTorch eager and
# torch.compile in one run, for
#   llama  vocab 4096, dim 256, 4 layers, 4 heads, ffn 768, seq 256, batch 8
#   gpt2   GPT-2 124M (vocab 50257, dim 768, 12 layers, tied head), batch 4, seq 64
# in fp32 and bf16, at 1 and 2 threads; random tokens, AdamW (weight decay 0.1), gradient
# clipping at 1.0 on both sides (tools/bench/train_vs_torch.lua and train_vs_torch.py).
#
#   tools/bench/train_vs_torch.sh [options] [path/to/tetra]      (default build/tetra)
#     --models llama,gpt2      --precisions fp32,bf16      --threads 1,2
#     --rounds 3               --steps 10 (timed)          --warmup 3 (untimed)
#     --wait-policy passive    OMP_WAIT_POLICY for both sides (Tetra's own default)
#   e.g. a quick look: --models llama --precisions fp32 --threads 2 --rounds 1 --steps 3
#
# PyTorch comes from PyPI into its own venv, TORCH_VENV (.deps/venv-torch2), installed on
# the first run: TORCH_SPEC (torch==2.15.0) without its dependencies plus its small pure
# Python ones; the Linux wheel does not import without the CUDA libraries it links
# against, so when the import fails those named in its metadata follow (about 3 GB).
#
# Measuring: each round runs Tetra, then eager, then compile, one process each, so load
# from other processes spreads over all three. Each process trains the same model on the
# same number of tokens: --warmup untimed steps (torch.compile compiles in them), then
# --steps timed steps; a process reports its median step. A configuration's figure is the
# median over its rounds. Both sides get the same OMP_NUM_THREADS, OPENBLAS_NUM_THREADS,
# torch.set_num_threads and OMP_WAIT_POLICY; OPENBLAS_CORETYPE passes through as found.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
tetra="$root/build/tetra"
models="llama,gpt2" precisions="fp32,bf16" thread_list="1,2"
rounds=3 steps=10 warmup=3 wait_policy=passive
venv="${TORCH_VENV:-$root/.deps/venv-torch2}"
torch_spec="${TORCH_SPEC:-torch==2.15.0}"

fail() { echo "train_vs_torch: $*" >&2; exit 2; }

while (($#)); do
  case "$1" in
    --models) models="$2"; shift 2 ;;
    --precisions) precisions="$2"; shift 2 ;;
    --threads) thread_list="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --wait-policy) wait_policy="$2"; shift 2 ;;
    -h|--help) sed -n '2,27p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) fail "unknown option $1 (see --help)" ;;
    *) tetra="$1"; shift ;;
  esac
done
[[ -x "$tetra" ]] || fail "no tetra binary at $tetra (build it, or pass its path)"
for m in ${models//,/ }; do
  [[ "$m" == llama || "$m" == gpt2 ]] || fail "--models takes llama and gpt2, not $m"
done
for p in ${precisions//,/ }; do
  [[ "$p" == fp32 || "$p" == bf16 ]] || fail "--precisions takes fp32 and bf16, not $p"
done

# -- PyTorch 2.x in its own venv ------------------------------------------------------------

py="$venv/bin/python"
torch_ok() {
  "$py" -c 'import sys, torch; sys.exit(not torch.__version__.startswith("2."))' 2>/dev/null
}
if ! torch_ok; then
  echo "installing $torch_spec from PyPI into $venv (once)"
  [[ -x "$py" ]] || python3 -m venv "$venv" || fail "python3 -m venv $venv failed"
  pure="filelock typing-extensions sympy mpmath networkx jinja2 MarkupSafe fsspec numpy setuptools>=77"
  echo "  pip install --no-deps $torch_spec $pure"
  # shellcheck disable=SC2086  # $pure is a list of names
  "$py" -m pip install -q --no-deps "$torch_spec" $pure ||
    fail "pip could not install $torch_spec into $venv (see pip's message above)"
  if ! torch_ok; then
    # The CUDA wheels torch names (cuda-toolkit[...], nvidia-*), markers stripped; not
    # triton (GPU kernels) nor cuda-bindings (Python bindings).
    mapfile -t cuda < <("$py" - <<'EOF'
from importlib.metadata import requires
for r in requires("torch"):
    spec = r.split(";")[0].strip()
    if spec.startswith(("cuda-toolkit", "nvidia-")):
        print(spec)
EOF
    )
    echo "  torch does not import without the CUDA libraries it links against; installing"
    echo "  them (about 3 GB): pip install ${cuda[*]}"
    echo "  (pip then says triton and cuda-bindings are missing: GPU-only, left out on purpose)"
    "$py" -m pip install -q "${cuda[@]}" ||
      fail "pip could not install torch's CUDA libraries into $venv (see pip's message above)"
  fi
  torch_ok || fail "$py still cannot import torch 2.x: $("$py" -c 'import torch' 2>&1 | tail -n 1)"
fi

# -- The machine and both sides' libraries -------------------------------------------------

cpu="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
flags="$(grep -m 1 '^flags' /proc/cpuinfo)"
isa=""
for f in avx2 fma avx512f avx512_bf16 amx_bf16; do
  [[ " $flags " == *" $f "* ]] && isa+="$f "
done
echo "cpu: $cpu, $(nproc) cores online, ${isa:-no AVX2}"
echo "tetra: $("$tetra" --version | tr '\n' ' ')"
"$py" "$here/train_vs_torch.py" --describe 2>/dev/null
echo "threads $thread_list, OMP_WAIT_POLICY=$wait_policy, OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-<unset>}"
echo "per process: $warmup untimed warm-up steps (torch.compile compiles in them), then" \
     "$steps timed steps, median step; $rounds rounds of tetra, eager, compile; median of rounds"
echo "bf16: tetra train.precision=bf16; pytorch torch.autocast(cpu, bfloat16); both fp32 master weights"
echo "pytorch: SDPA attention, fused AdamW; torch.compile on forward + loss (backward follows), AdamW eager"
export OMP_WAIT_POLICY="$wait_policy"

results="$(mktemp)" errors="$(mktemp)"
trap 'rm -f "$results" "$errors"' EXIT

field() {  # field NAME JSON -> the value after "NAME":
  sed -E "s/.*\"$1\": ?\"?([^,\"}]+).*/\1/" <<<"$2"
}
run_one() {  # run_one IMPL MODEL PRECISION THREADS -> the JSON line
  local out
  if [[ "$1" == tetra ]]; then
    out="$(TRAIN_VS_TORCH_MODEL="$2" TRAIN_VS_TORCH_WARMUP="$warmup" "$tetra" run \
      "$here/train_vs_torch.lua" --set "train.steps=$steps" --set "train.precision=$3" \
      2>"$errors" | tail -n 1)" || true
  else
    out="$("$py" "$here/train_vs_torch.py" --mode "$1" --model "$2" --precision "$3" \
      --threads "$4" --steps "$steps" --warmup "$warmup" 2>"$errors" | tail -n 1)" || true
  fi
  if [[ "$out" != *tokens_per_s* ]]; then
    cat "$errors" >&2
    fail "$1 $2 $3 at $4 threads gave no result"
  fi
  echo "$out"
}

for m in ${models//,/ }; do
  for p in ${precisions//,/ }; do
    for t in ${thread_list//,/ }; do
      export OMP_NUM_THREADS="$t" OPENBLAS_NUM_THREADS="$t"
      for ((r = 1; r <= rounds; r++)); do
        echo "== $m $p, $t threads, round $r/$rounds (load average $(cut -d ' ' -f 1-3 /proc/loadavg))"
        for impl in tetra eager compile; do
          j="$(run_one "$impl" "$m" "$p" "$t")"
          echo "$impl: $j"
          echo "$m $p $t $impl $(field tokens_per_s "$j") $(field params "$j")" >>"$results"
        done
      done
    done
  done
done

# -- The table ------------------------------------------------------------------------------

sort -k1,1 -k2,2r -k3,3n -k4,4 -k5,5g "$results" | awk -v models="$models" \
  -v precisions="$precisions" -v threads="$thread_list" '
{ k = $1 " " $2 " " $3 " " $4; v[k, ++n[k]] = $5; params[$1, $4 == "tetra" ? "tetra" : "torch"] = $6 }
function tps(x) { return x < 100 ? sprintf("%.1f", x) : sprintf("%.0f", x) }
function median(k,   c) {
  c = n[k]
  return c % 2 ? v[k, (c + 1) / 2] : (v[k, c / 2] + v[k, c / 2 + 1]) / 2
}
END {
  nm = split(models, M, ","); np = split(precisions, P, ","); nt = split(threads, T, ",")
  print ""
  for (i = 1; i <= nm; i++)
    printf "%s parameters: tetra %d, pytorch %d%s\n", M[i], params[M[i], "tetra"],
      params[M[i], "torch"], params[M[i], "tetra"] == params[M[i], "torch"] ? "" : "  (DIFFER)"
  print ""
  print "tokens/s, median of rounds (each round: the median of its timed steps)"
  printf "%-6s %-5s %7s %9s %9s %9s %11s %13s %14s\n", "model", "prec", "threads", "tetra",
    "eager", "compile", "tetra/eager", "tetra/compile", "tetra bf16/fp32"
  for (i = 1; i <= nm; i++) for (j = 1; j <= np; j++) for (l = 1; l <= nt; l++) {
    b = M[i] " " P[j] " " T[l]
    te = median(b " tetra"); ea = median(b " eager"); co = median(b " compile")
    f32 = M[i] " fp32 " T[l] " tetra"
    ratio = P[j] == "bf16" && n[f32] ? sprintf("%.2f", te / median(f32)) : "-"
    printf "%-6s %-5s %7s %9s %9s %9s %11.2f %13.2f %14s\n", M[i], P[j], T[l], tps(te),
      tps(ea), tps(co), te / ea, te / co, ratio
  }
}'
