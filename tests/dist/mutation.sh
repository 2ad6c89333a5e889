#!/usr/bin/env bash
# The layout parity rows (tests/dist/layouts.txt) must be able to fail. Each case plants a
# bug in a throw-away copy of the Lua library (TETRA_HOME points the binary at it), runs
# one row of the table through tools/compare_loss with the copy on the distributed side
# only (the single process keeps the real library) and expects it to fail on the quantity
# the bug moves; it also checks that the bug's site still exists, so a refactor cannot
# turn a case into a silent pass.
# Usage: bash mutation.sh /path/to/tetra   (exit 77: skipped)
set -u
source "$(dirname "$0")/prelude.bash"
table="$root/tests/dist/layouts.txt"

# row NAME -> the compare_loss arguments of that row of the table.
row() {
  awk -F'|' -v name="$1" '
    function trim(s) { gsub(/^[ \t]+|[ \t]+$/, "", s); return s }
    /^#/ || NF < 5 { next }
    trim($1) == name {
      printf "--np %s", trim($2)
      n = split(trim($4), lay, " "); for (i = 1; i <= n; i++) if (lay[i] != "-") printf " --layout %s", lay[i]
      if (NF >= 6) { n = split(trim($6), o, " "); for (i = 1; i <= n; i++) { split(o[i], kv, "="); printf " --%s %s", kv[1], kv[2] } }
      printf " %s", trim($3)
      n = split(trim($5), com, " "); for (i = 1; i <= n; i++) if (com[i] != "-") printf " --set %s", com[i]
      found = 1
    }
    END { exit !found }' "$table"
}

failures=0
# mutant NAME FILE PATTERN REPLACEMENT ROW WHAT: with the first line of lua/tetra/FILE matching
# the fixed string PATTERN replaced by REPLACEMENT, the row must fail on WHAT (loss or
# grad_norm: the summary's worst difference of that quantity is over its tolerance).
mutant() {
  local name="$1" file="$2" pattern="$3" replacement="$4" rowname="$5" what="$6"
  local home="$work/$name"
  mkdir -p "$home"
  cp -r "$root/lua" "$root/engine" "$home/"
  local target="$home/lua/tetra/$file"
  if ! grep -qF -- "$pattern" "$target"; then
    echo "FAIL: $name: the mutation site is gone from lua/tetra/$file: $pattern"; failures=$((failures + 1)); return
  fi
  PAT="$pattern" REP="$replacement" awk '!done && index($0, ENVIRON["PAT"]) {
      i = index($0, ENVIRON["PAT"]); $0 = substr($0, 1, i - 1) ENVIRON["REP"] substr($0, i + length(ENVIRON["PAT"])); done = 1 }
    { print }' "$target" >"$target.new" && mv "$target.new" "$target"
  local args
  args="$(row "$rowname")" || { echo "FAIL: $name: no row $rowname in the table"; failures=$((failures + 1)); return; }
  # shellcheck disable=SC2086  # args is a list of words on purpose
  "$root/tools/compare_loss" --tetra "$tetra" --env TETRA_HOME="$home" $args >"$work/$name.out" 2>&1
  local rc=$?
  local summary
  summary="$(grep '^compare_loss:' "$work/$name.out" | tail -n 1)"
  if [ "$rc" -ne 1 ] || ! grep -q "FAIL" <<<"$summary"; then
    echo "FAIL: $name: row $rowname did not catch the bug (exit $rc): $summary"
    tail -n 5 "$work/$name.out"; failures=$((failures + 1)); return
  fi
  # The quantity the bug moves is out of tolerance at some step.
  if ! grep -Eq "<-- $what" "$work/$name.out"; then
    echo "FAIL: $name: row $rowname failed, but not on $what:"; tail -n 8 "$work/$name.out"
    failures=$((failures + 1)); return
  fi
  echo "caught: $name (row $rowname, $what): ${summary#compare_loss: }"
}

# The global gradient norm of a split model 1.29 times too small (the sum of squares
# divided by 1.29^2 times the replicas: what the clip and the step's one read both see).
mutant tp_grad_norm parallel/init.lua "{ group = self.mesh.world, replicas = replicas })" \
  "{ group = self.mesh.world, replicas = replicas * 1.6641 })" llama_tp2 grad_norm
# Data-parallel replicas counted once each in the norm (as if the gradients were summed).
mutant zero_norm_replicas parallel/init.lua "local replicas = shards and 1 or self.mesh.dpcp.size" \
  "local replicas = 1" llama_tp2_dp2 grad_norm
# Micro-batch losses not divided by their count (gradients summed over accumulation).
mutant accum_scale parallel/step.lua "local mean = n_micro > 1 and F.scale(loss, 1.0 / n_micro) or loss" \
  "local mean = loss" llama_tp2_dp2_zero1 grad_norm
# The tied embedding's gradients not summed over the first and last stage.
mutant tied_sum parallel/init.lua 'self.tied_group:all_reduce(g, "sum")' "local _ = g" llama_pp2_tied grad_norm
# Sequence parallelism: the norms' weight gradients left partial (not summed over tp).
mutant sp_partial_grads parallel/tensor.lua "self[name] = g:copy_to_group(p)" "self[name] = F.scale(p, 1.0)" \
  llama_tp2_sp grad_norm
# A key/value head held by two ranks: their weight gradients not summed.
mutant kv_copies parallel/tensor.lua "local w = copies:copy_to_group(self.weight)" \
  "local w = F.scale(self.weight, 1.0)" llama_tp4_kv2 grad_norm
# Row-parallel layers left in f32 under bf16 (amp's GEMM not used; their bf16 input
# widened, as an f32 layer would need).
mutant tp_precision parallel/tensor.lua "local part = self.gemm(x, self.weight, nil)" \
  "local part = F.linear(x:float(), self.weight, nil)" llama_tp2_bf16 loss
# Context parallelism: the keys of the other chunks not gathered (each rank attends
# within its own chunks).
mutant cp_gather parallel/context.lua "if positions == nil then return plain(self, q, k, v) end" \
  "if true then return plain(self, q, k, v, positions) end" llama_cp2 loss
# Pipeline parallelism: the last stage's micro-batch losses not divided by their count.
mutant pp_micro_scale parallel/pipeline.lua "local scaled = amp_ctx:scale_loss(y, n_micro)" \
  "local scaled = amp_ctx:scale_loss(y, 1)" llama_tp2_pp2 grad_norm

[ "$failures" -eq 0 ] && echo PASS
exit $((failures > 0))
