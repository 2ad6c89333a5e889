#!/usr/bin/env bash
# The Prometheus endpoint under load and abuse (one process; loopback only):
#  1. a port already in use: one line naming the address, the error and the key, exit 1,
#     no traceback; with log.prometheus_required=false a warning and the run completes;
#  2. hostile clients (stalled mid-request, garbage, a 70 kB request line, answers never
#     read, POST) while a normal scrape every 50 ms must keep answering and the run must
#     finish every step;
#  3. the step time while a scraper hammers the endpoint at 50 scrapes/s against quiet
#     windows of the same run: printed, not asserted (the machine is shared: its load
#     varies more than the endpoint costs; tools/bench/prometheus.sh pools 9 such runs
#     with paired windows and a decoy server, and puts the step-time change at
#     -0.6% +- 1.5%). What the endpoint costs is
#     measured directly, and held to the issue's 2%: the CPU seconds of the endpoint's
#     thread (tetra_exporter_cpu_seconds_total) must stay under 2% of the CPU seconds
#     training used in the same windows: the most it could slow a step down were it to
#     share training's core; and the time training waited for the store's lock
#     (tetra_telemetry_lock_wait_seconds_total) must stay under 0.2% of the steps' time.
# Usage: bash prometheus_endpoint.sh /path/to/tetra   (exit 77: skipped)
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root" || exit 1
fail() { echo "FAIL: $*"; exit 1; }
tmp="$(mktemp -d)"
held=""
trap '[ -n "$held" ] && kill $held 2>/dev/null; rm -rf "$tmp"' EXIT
clients="$root/tests/cli/prometheus_clients.py"
run() { "$tetra" run recipes/tiny.lua --set train.threads=1 --set log.progress=false "$@"; }

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# 1. The port is taken (a listener held by another process).
port=$(free_port)
python3 -c "
import socket, time
s = socket.socket(); s.bind(('127.0.0.1', $port)); s.listen(1); time.sleep(60)" &
held=$!
for _ in $(seq 50); do ss -ltn | grep -q ":$port " && break; sleep 0.1; done
run --set train.steps=2 --set log.prometheus_port=$port >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 1 ] || fail "port in use: exit $rc, want 1 ($(cat "$tmp/err"))"
[ "$(wc -l < "$tmp/err")" -eq 1 ] || fail "port in use: want one line on stderr, got: $(cat "$tmp/err")"
grep -q "cannot serve Prometheus metrics on 127.0.0.1:$port: Address already in use" "$tmp/err" \
  || fail "port in use: unclear message: $(cat "$tmp/err")"
grep -q "log.prometheus_required=false" "$tmp/err" || fail "the message names no way out: $(cat "$tmp/err")"
grep -qi traceback "$tmp/err" && fail "traceback on a taken port"
run --set train.steps=3 --set log.prometheus_port=$port --set log.prometheus_required=false \
    --set log.metrics_file="$tmp/m.jsonl" >"$tmp/out" 2>"$tmp/err" \
  || fail "prometheus_required=false: the run failed: $(cat "$tmp/err")"
grep -q "warning: rank 0: cannot serve Prometheus metrics on 127.0.0.1:$port" "$tmp/err" \
  || fail "prometheus_required=false: no warning: $(cat "$tmp/err")"
[ "$(wc -l < "$tmp/m.jsonl")" -eq 3 ] || fail "prometheus_required=false: not every step ran"
kill $held; held=""
echo "port in use: $(cat "$tmp/err")"

# 2. Hostile clients during a run.
port=$(free_port)
steps=500
run --set train.steps=$steps --set log.prometheus_port=$port \
    --set log.metrics_file="$tmp/hostile.jsonl" >"$tmp/out" 2>"$tmp/err" &
train=$!
timeout -k 10 60 python3 "$clients" hostile $port 40 || { kill $train; fail "hostile clients"; }
wait $train || fail "the run failed under hostile clients: $(cat "$tmp/err")"
[ "$(wc -l < "$tmp/hostile.jsonl")" -eq $steps ] || fail "not every step ran under hostile clients"

# 3. Step time with and without a scraper, paired within one run: windows of 1 s
# scraping at 50/s alternate with 1 s of quiet (the machine's changing load hits both).
# A model with ~60 ms steps on one thread (OpenBLAS too).
export OPENBLAS_NUM_THREADS=1
port=$(free_port)
run --set model.dim=128 --set model.n_layers=4 --set model.seq_len=64 \
    --set model.ffn_hidden=384 --set train.steps=240 --set log.prometheus_port=$port \
    >/dev/null 2>"$tmp/err" &
train=$!
timeout -k 10 90 python3 "$clients" toggle $port 80 50 1 > "$tmp/toggle" || { kill $train; fail "toggle: $(cat "$tmp/toggle")"; }
wait $train || fail "the scraped run failed: $(cat "$tmp/err")"
cat "$tmp/toggle"
waited=$(sed -E 's/.*steps \(([0-9.]+)%\)$/\1/' "$tmp/toggle")
share=$(sed -E 's/.*<([0-9.]+)% of training CPU>.*/\1/' "$tmp/toggle")
# What the design promises, measured directly: training waits for a scrape only while it
# copies the store (microseconds), not while it formats or sends.
python3 -c "import sys; sys.exit(0 if float('$waited') < 0.2 else 1)" \
  || fail "training waited $waited% of its step time for the metrics store (limit 0.2%)"
python3 -c "import sys; sys.exit(0 if float('$share') < 2 else 1)" \
  || fail "the endpoint's thread used $share% of training's CPU time at 50 scrapes/s (limit 2%)"
echo "endpoint ok"
