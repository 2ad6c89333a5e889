#!/usr/bin/env bash
# What a scraper hammering the Prometheus endpoint costs the training step, measured
# against the machine's noise. RUNS runs of SECONDS each (one process, one thread, the
# model of tests/cli/prometheus_endpoint.sh); in each, windows of 1 s take turns: quiet,
# scraping the run at 50/s, quiet, scraping a decoy (another server on loopback serving
# the same text: the same scraper and serving, without the run's endpoint). Each scraped
# window is compared with the quiet windows beside it (slow drifts cancel), and the
# windows of every run are pooled: prints the change in step time with its 95% interval,
# for the run's endpoint and for the decoy. The issue's goal: the endpoint within 2%.
#   tools/bench/prometheus.sh [path/to/tetra] [RUNS] [SECONDS]
set -eu
root="$(cd "$(dirname "$0")/../.." && pwd)"
tetra="${1:-$root/build/tetra}"
runs="${2:-9}"
seconds="${3:-100}"
clients="$root/tests/cli/prometheus_clients.py"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export OPENBLAS_NUM_THREADS=1 TOGGLE_WINDOWS="$tmp/windows.jsonl"
echo "# OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive (tetra default)} cores=$(nproc) load=$(cut -d' ' -f1 /proc/loadavg)"
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
cd "$root"
for r in $(seq "$runs"); do
  port=$(free_port)
  decoy=$(free_port)
  # more steps than the windows need: the run is stopped when they end
  "$tetra" run recipes/tiny.lua --set train.threads=1 --set log.progress=false \
      --set model.dim=128 --set model.n_layers=4 --set model.seq_len=64 \
      --set model.ffn_hidden=384 --set train.steps=$((seconds * 20)) \
      --set log.prometheus_port=$port >/dev/null 2>"$tmp/err" &
  train=$!
  python3 "$clients" decoy $port $decoy $((seconds + 10)) &
  served=$!
  timeout $((seconds + 40)) python3 "$clients" toggle $port "$seconds" 50 1 $decoy \
    | sed -E "s/^toggle:/run $r:/"
  kill $train $served 2>/dev/null || true
  wait 2>/dev/null || true
done
echo "pooled (scraped or decoy windows against the quiet ones beside them):"
python3 "$clients" pool "$tmp/windows.jsonl" | sed -e 's/^loud:/  the run scraped:/' \
  -e 's/^decoy:/  decoy scraped:  /'
