#!/usr/bin/env bash
# FP8 under context parallelism records each amax once a step, as one process does.
# Context parallelism's backward runs in two passes (the key/value gradients are summed
# over the ranks in between), and an FP8 layer must run whole in the first of them, or its
# output gradient's amax is recorded twice and the next scales move. Since FP8 keeps bf16
# activations, the layout row llama_cp2_fp8 compares one step only (later steps drift like
# bf16's), so that defect would show in no loss: here the FP8 scaling state saved after 3
# steps on 2 ranks (parallel.context_parallel_size=2) must hold, for every layer and role
# (x, w, g), the same number of recorded amaxes and ring position as one process's, and
# amaxes within 5% of its (they are maxima of nearly equal tensors; the output gradients'
# twice one process's, see below).
# Usage: bash fp8_cp_amax.sh /path/to/tetra   (exit 77: skipped)
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
command -v mpirun >/dev/null || { echo "skipped: no mpirun"; exit 77; }
export OMP_NUM_THREADS=1
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

common=(--set train.steps=3 --set train.precision=fp8 --set train.lr=3e-3
        --set checkpoint.every=3 --set log.progress=false)
if ! "$tetra" run "$root/recipes/tiny.lua" "${common[@]}" --set checkpoint.dir="$work/one" \
     > "$work/one.log" 2>&1; then
  echo "FAIL: the single-process run failed:"; tail -5 "$work/one.log"; exit 1
fi
if ! mpirun --oversubscribe -np 2 "$tetra" run "$root/recipes/tiny.lua" "${common[@]}" \
     --set parallel.context_parallel_size=2 --set checkpoint.dir="$work/cp" \
     > "$work/cp.log" 2>&1; then
  echo "FAIL: the 2-rank run failed:"; tail -5 "$work/cp.log"; exit 1
fi
python3 - "$work" <<'PY'
import glob, json, sys
work = sys.argv[1]
def state(d, rank):
    files = glob.glob(f"{work}/{d}/step_*/fp8_{rank:05d}.json")
    if len(files) != 1:
        print(f"FAIL: {d}: expected one fp8_{rank:05d}.json, found {files}"); sys.exit(1)
    return json.load(open(files[0]))
one = state("one", 0)
bad, n = 0, 0
for rank in (0, 1):
    cp = state("cp", rank)
    if sorted(cp) != sorted(one):
        print(f"FAIL: rank {rank}'s FP8 layers {sorted(cp)} are not one process's {sorted(one)}")
        sys.exit(1)
    for layer in sorted(one):
        for role in ("x", "w", "g"):
            a, b = one[layer][role], cp[layer][role]
            n += 1
            if (a["filled"], a["pos"]) != (b["filled"], b["pos"]):
                print(f"FAIL: rank {rank} {layer} {role}: {b['filled']} amaxes recorded, ring at "
                      f"{b['pos']}; one process: {a['filled']} at {a['pos']}")
                bad = 1
                continue
            # Each rank's loss is the mean over its own half of the tokens (the halves'
            # gradients are averaged later), so its output gradients are twice one
            # process's: a power of two, which moves no FP8 code.
            f = 2.0 if role == "g" else 1.0
            for i, (x, y) in enumerate(zip(a["history"], b["history"])):
                if abs(f * x - y) > 0.05 * max(abs(f * x), 1e-30):
                    print(f"FAIL: rank {rank} {layer} {role} amax {i}: {y:.6g}, one process {x:.6g}")
                    bad = 1
if bad:
    sys.exit(1)
print(f"PASS: {n} histories (2 ranks x layers x x/w/g) record what one process records")
PY
