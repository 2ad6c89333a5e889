#!/usr/bin/env bash
# tools/prometheus/tetra-rules.yml: promtool checks the rules and runs their unit tests
# (tetra-rules.test.yml: every alert fires on its synthetic series and stays silent
# before). Then each alert is broken on a copy (a threshold moved, a label dropped, an
# expression inverted) and the unit tests must fail: they can catch a wrong rule.
# Usage: bash prometheus_rules.sh /path/to/tetra   (exit 77: skipped)
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
if ! command -v promtool >/dev/null; then
  [ "${CI:-}" = true ] && { echo "FAIL: no promtool (CI=true; tools/setup installs prometheus)"; exit 1; }
  echo "skipped: no promtool (apt-get install prometheus)"; exit 77
fi
fail() { echo "FAIL: $*"; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
rules="$root/tools/prometheus/tetra-rules.yml"
promtool check rules "$rules" || fail "promtool check rules"
promtool test rules "$root/tools/prometheus/tetra-rules.test.yml" || fail "promtool test rules"

n=$(grep -c '^      - alert:' "$rules")
tested=$(grep -c 'alertname:' "$root/tools/prometheus/tetra-rules.test.yml")
for a in $(grep '^      - alert:' "$rules" | awk '{print $3}'); do
  grep -q "alertname: $a\$" "$root/tools/prometheus/tetra-rules.test.yml" || fail "alert $a has no unit test"
done

mutants=(
  's/abs(tetra_loss) == Inf/abs(tetra_loss) == 0/'
  's/tetra_last_step_timestamp_seconds > 600/tetra_last_step_timestamp_seconds > 6000/'
  's/up{job=~"tetra.\*"} == 0/up{job=~"tetra.*"} == 1/'
  's/count by (job) (tetra_step) < on (job)/count by (job) (tetra_step) > on (job)/'
  's/< 0.7 \* avg by (job)/< 0.3 * avg by (job)/'
  's/min by (job) (tetra_loss_scale) < 1/min by (job) (tetra_loss_scale) < 0.1/'
  's/increase(tetra_skipped_steps_total\[10m\])) > 10/increase(tetra_skipped_steps_total[10m])) > 100/'
  's/DCGM_FI_DEV_GPU_TEMP > 85/DCGM_FI_DEV_GPU_TEMP > 95/'
  's/increase(tetra_gpu_xid_errors_total\[5m\]) > 0/increase(tetra_gpu_xid_errors_total[5m]) > 1/'
  's/min by (job) (tetra_loss_scale)/min (tetra_loss_scale)/'
  's/group_left 1.5 \* quantile/group_left 1.3 * quantile/'
  's/quantile by (job) (0.5, tetra_step_compute_seconds)/quantile (0.5, tetra_step_compute_seconds)/'
)
for m in "${mutants[@]}"; do
  cp "$root/tools/prometheus/tetra-rules.test.yml" "$tmp/"
  sed "$m" "$rules" > "$tmp/tetra-rules.yml"
  cmp -s "$rules" "$tmp/tetra-rules.yml" && fail "mutant '$m' changed nothing (the rule moved?)"
  if promtool test rules "$tmp/tetra-rules.test.yml" >/dev/null 2>&1; then
    fail "the unit tests pass with the rule broken by '$m'"
  fi
done
echo "rules ok: $n alerts, $tested unit checks, ${#mutants[@]} broken rules caught"
