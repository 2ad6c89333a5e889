#!/usr/bin/env bash
# The Prometheus endpoint scraped by a real Prometheus: a 2-rank data-parallel run serves
# log.prometheus_port (+ local rank) on 127.0.0.1; a prometheus started here (loopback,
# a temporary directory, free ports, scrape config from `tetra monitor-config`, the alert
# rules loaded) scrapes every 100 ms; prometheus_check.py then queries its HTTP API:
# every documented series for both ranks with their labels, the step increasing, the
# loss equal to the metrics file's at the same step, histogram counts = steps, the
# phases adding up to the step time, collectives timed by op and group, every dashboard
# expression returning data, the rules healthy and silent.
# Usage: bash prometheus.sh /path/to/tetra   (exit 77: skipped)
set -u
source "$(dirname "$0")/prelude.bash"
fail() { echo "FAIL: $*"; [ -f "$work/prom.log" ] && tail -5 "$work/prom.log"; exit 1; }
if ! command -v prometheus >/dev/null; then
  [ "${CI:-}" = true ] && { echo "FAIL: no prometheus (CI=true; tools/setup installs it)"; exit 1; }
  echo "skipped: no prometheus (apt-get install prometheus)"; exit 77
fi

# Two consecutive free ports for the ranks, one for Prometheus (bound and released).
read -r base pport < <(python3 - <<'PY'
import random, socket
def free(p):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p)); return True
    except OSError:
        return False
    finally:
        s.close()
while True:
    b = random.randrange(20000, 40000)
    if free(b) and free(b + 1) and free(b + 2):
        print(b, b + 2); break
PY
)
job=tetra-test
steps=600
every=100
echo "127.0.0.1 slots=2" > "$work/hosts"
"$tetra" monitor-config "$work/hosts" --port "$base" --np 2 --job "$job" --interval 100ms \
  > "$work/prometheus.yml" || fail "monitor-config"
cat >> "$work/prometheus.yml" <<YML
global:
  evaluation_interval: 1s
rule_files:
  - $root/tools/prometheus/tetra-rules.yml
YML
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/data" \
  --web.listen-address="127.0.0.1:$pport" --log.level=warn > "$work/prom.log" 2>&1 &
prom_pid=$!
trap 'kill $prom_pid 2>/dev/null; wait $prom_pid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$pport/-/ready" >/dev/null && break
  sleep 0.2
done
curl -sf "http://127.0.0.1:$pport/-/ready" >/dev/null || fail "prometheus did not start"
# Service discovery hands targets to the scrapers in batches (every 5 s): wait until
# both ranks' targets are scraped (down, for now) before training starts.
for _ in $(seq 100); do
  n=$(curl -sf "http://127.0.0.1:$pport/api/v1/targets?state=active" | grep -o '"health":"down"' | wc -l)
  [ "$n" -ge 2 ] && break
  sleep 0.2
done
[ "$n" -ge 2 ] || fail "prometheus did not start scraping the 2 targets"

start=$(date +%s.%N)
out="$(TETRA_RESTART_COUNT=2 timeout -k 10 240 mpirun --oversubscribe -np 2 -x TETRA_RESTART_COUNT \
        "$tetra" run recipes/tiny.lua --set parallel.data_parallel_size=2 \
        --set train.steps=$steps --set log.every=100 --set train.peak_tflops=0.2 \
        --set log.prometheus_port=$base --set log.prometheus_job=$job \
        --set checkpoint.dir="$work/ckpt" --set checkpoint.every=$every \
        --set log.metrics_file="$work/metrics.jsonl" 2>&1)" || fail "run failed: $out"
sleep 1   # the last scrapes land
end=$(date +%s.%N)
python3 "$root/tests/dist/prometheus_check.py" --prom "http://127.0.0.1:$pport" --job "$job" \
  --ranks 2 --steps $steps --checkpoint-every $every --restarts 2 \
  --metrics "$work/metrics.jsonl" --doc "$root/docs/monitoring.md" \
  --dashboard "$root/tools/grafana/tetra.json" --start "$start" --end "$end" \
  || fail "prometheus_check.py"
