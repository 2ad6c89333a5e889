#!/usr/bin/env bash
# tetra monitor-config HOSTFILE --port BASE [--np N]: one target per rank, host by host in
# Open MPI's by-slot order (host h's local rank k on BASE + k), honor_labels so the
# ranks' job label wins; promtool accepts the printed config; bad usage is one line and
# exit 2.
# Usage: bash monitor_config.sh /path/to/tetra
set -u
tetra="${1:?usage: $0 /path/to/tetra}"
fail() { echo "FAIL: $*"; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

cat > "$tmp/hosts" <<'H'
# the job's nodes
node-a slots=2
node-b   slots=3 max_slots=8   # trailing comment

node-c slots=4
H
"$tetra" monitor-config "$tmp/hosts" --port 9400 --np 6 --job llama7b --interval 5s \
  > "$tmp/scrape.yml" || fail "monitor-config exit $?"
got="$(grep -o "'[^']*'" "$tmp/scrape.yml" | tr -d "'" | tr '\n' ' ')"
want="node-a:9400 node-a:9401 node-b:9400 node-b:9401 node-b:9402 node-c:9400 "
[ "$got" = "$want" ] || fail "targets '$got', want '$want'"
grep -q '^  - job_name: llama7b$' "$tmp/scrape.yml" || fail "no job_name llama7b"
grep -q '^    honor_labels: true$' "$tmp/scrape.yml" || fail "no honor_labels"
grep -q '^    scrape_interval: 5s$' "$tmp/scrape.yml" || fail "no scrape_interval 5s"
n=$("$tetra" monitor-config "$tmp/hosts" --port 9400 | grep -c "^          - '")
[ "$n" -eq 9 ] || fail "without --np: $n targets, want every slot (9)"

if command -v promtool >/dev/null; then
  promtool check config "$tmp/scrape.yml" >/dev/null || fail "promtool rejects the config"
elif [ "${CI:-}" = true ]; then
  fail "no promtool (CI=true)"
fi

bad() {   # expected message, then the arguments
  local want="$1"; shift
  "$tetra" monitor-config "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  [ $rc -eq 2 ] || fail "$*: exit $rc, want 2"
  [ "$(wc -l < "$tmp/err")" -eq 1 ] || fail "$*: want one line, got: $(cat "$tmp/err")"
  grep -q -- "$want" "$tmp/err" || fail "$*: '$(cat "$tmp/err")' lacks '$want'"
  [ -s "$tmp/out" ] && fail "$*: printed a config anyway"
  return 0
}
bad "--port BASE (log.prometheus_port) is required" "$tmp/hosts"
bad "--port needs a TCP port, got 70000" "$tmp/hosts" --port 70000
bad "--np 10 is more than the hostfile's 9 slots" "$tmp/hosts" --port 9400 --np 10
bad "--np needs a rank count, got two" "$tmp/hosts" --port 9400 --np two
bad "cannot read $tmp/none" "$tmp/none" --port 9400
bad "no HOSTFILE" --port 9400
bad "unknown option --prot" "$tmp/hosts" --prot 9400
bad "--interval needs a duration" "$tmp/hosts" --port 9400 --interval soon
printf 'node-a slots=2\nnode-b\n' > "$tmp/noslots"
bad "noslots:2: 'node-b' needs slots=N" "$tmp/noslots" --port 9400
echo "monitor-config ok: $got"
