#!/usr/bin/env bash
# tools/test --fresh [ctest args...]: the README's promise checked on a fresh machine. A
# clean clone of this repository's HEAD (committed work only) goes into a container of the
# bare debootstrap image (debian:bookworm, tests/docker/docker.bash makes it), where the
# README's two commands run as written, as root: tools/demo, then CI=true tools/test with
# the given ctest arguments (none: the whole suite and tools/mutate, about an hour on 2
# cores). CI=true turns every skip but the CUDA tests' into a failure. Nothing of this
# machine's set-up reaches the container but its network (--network host: apt's mirror
# and PyPI) and its CA bundle (the egress may need it; pip and curl are pointed at it).
# NET_ADMIN and SYS_ADMIN: the multi-host tests make network namespaces (and, with the
# host's network, their bridge in it, as on this machine itself); --privileged is more
# than some hosts' runtimes grant.
# Prints the time each command took; exits with the first failure's status.
# Usage: tests/docker/fresh.sh [ctest args...]   (root)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
base=debian:bookworm name=tetra-fresh
export DOCKER_BUILDKIT=0
started_pid="" work="$(mktemp -d)"
t0=$(date +%s)
say() { echo "fresh: [$(( $(date +%s) - t0 ))s] $*"; }
skip() {
  [ "${CI:-}" = true ] && { echo "fresh: FAIL: $* (CI=true)" >&2; exit 1; }
  echo "fresh: skipped: $*"; exit 77
}
cleanup() {
  docker rm -f "$name" >/dev/null 2>&1 || true
  declare -F stop_started_daemon >/dev/null && stop_started_daemon
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

source "$root/tests/docker/docker.bash"

git -C "$root" diff --quiet HEAD -- 2>/dev/null ||
  say "note: uncommitted changes are not in the clone; it is HEAD ($(git -C "$root" rev-parse --short HEAD))"
git clone -q --no-local "$root" "$work/src"
say "clean clone of $(git -C "$work/src" rev-parse --short HEAD) in a bare $base container"

ca=()
for f in /etc/ssl/certs/ca-certificates.crt; do
  [ -f "$f" ] && ca=(-v "$f:/etc/tetra-host-ca.crt:ro" -e PIP_CERT=/etc/tetra-host-ca.crt
                     -e SSL_CERT_FILE=/etc/tetra-host-ca.crt -e REQUESTS_CA_BUNDLE=/etc/tetra-host-ca.crt
                     -e CURL_CA_BUNDLE=/etc/tetra-host-ca.crt)
done
# No arguments must stay none: printf ' %q' with nothing to print gives " ''", an empty
# argument that made tools/test skip tools/mutate (a selection, not the whole suite).
args=""
[ $# -gt 0 ] && args=$(printf ' %q' "$@")
docker rm -f "$name" >/dev/null 2>&1 || true
set +e
docker run --rm --name "$name" --cap-add NET_ADMIN --cap-add SYS_ADMIN --network host --hostname tetra-fresh \
  -v "$work/src:/src" -w /src "${ca[@]}" -e DEBIAN_FRONTEND=noninteractive "$base" \
  bash -c 's=$(date +%s)
           tools/demo || { echo "fresh: FAIL: tools/demo exited $?"; exit 1; }
           echo "fresh: tools/demo passed in $(( $(date +%s) - s )) s"; s=$(date +%s)
           CI=true tools/test'"$args"' || { rc=$?; echo "fresh: FAIL: tools/test exited $rc"; exit $rc; }
           echo "fresh: tools/test passed in $(( $(date +%s) - s )) s"' 2>&1 | tee "$work/fresh.log"
rc=${PIPESTATUS[0]}
set -e
[ "$rc" -eq 0 ] && say "PASS: the README's two commands on a fresh Debian 12" ||
  say "FAIL: exit $rc"
exit "$rc"
