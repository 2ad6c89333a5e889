# Sourced by tests/docker/run.sh and tests/docker/fresh.sh after they set root, work,
# base, say (a progress line), skip (exit 77, or a failure under CI=true) and
# started_pid=""; their cleanup calls stop_started_daemon. Makes sure that:
#  1. dockerd runs (Debian's docker.io, vfs storage, --iptables=false), installing docker.io
#     and debootstrap when missing;
#  2. the image $base exists (debootstrap from this machine's Debian mirror).

# Stops the dockerd this file started, if it did, waiting up to 30 s for it to go.
stop_started_daemon() {
  [ -n "$started_pid" ] || return 0
  kill "$started_pid" 2>/dev/null || true
  for _ in $(seq 30); do kill -0 "$started_pid" 2>/dev/null || break; sleep 1; done
}

[ "$(id -u)" = 0 ] || skip "needs root (dockerd, debootstrap)"
# What the test needs and the build packages do not bring: Debian's docker.io (client and
# dockerd) and debootstrap, installed here as the tests install their references.
if ! command -v docker >/dev/null || ! command -v debootstrap >/dev/null ||
   { ! docker info >/dev/null 2>&1 && [ ! -x /usr/sbin/dockerd ]; }; then
  say "installing docker.io and debootstrap (apt-get)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker.io \
    debootstrap >"$work/apt.log" 2>&1 ||
    { apt-get update -q >>"$work/apt.log" 2>&1 &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker.io \
        debootstrap >>"$work/apt.log" 2>&1; } ||
    { tail -n 5 "$work/apt.log"; skip "docker.io did not install"; }
fi
command -v docker >/dev/null || skip "no docker client (apt-get install docker.io)"
if ! docker info >/dev/null 2>&1; then
  [ -x /usr/sbin/dockerd ] || skip "no dockerd (apt-get install docker.io)"
  mkdir -p /var/lib/docker
  /usr/sbin/dockerd --storage-driver=vfs --iptables=false --data-root /var/lib/docker \
    --pidfile /run/tetra-test-dockerd.pid >"$work/dockerd.log" 2>&1 &
  started_pid=$!
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "docker: FAIL: dockerd did not start:"; tail "$work/dockerd.log"; exit 1; }
  say "started dockerd (pid $started_pid, vfs, --iptables=false)"
fi

if ! docker image inspect "$base" >/dev/null 2>&1; then
  command -v debootstrap >/dev/null || skip "no $base image and no debootstrap"
  # The mirror this machine's apt uses (deb822 or one-line sources).
  mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
    | grep -oE 'https?://[^ ]+/debian/?( |$)' | head -n 1 | tr -d ' ' || true)
  mirror="${mirror:-http://deb.debian.org/debian}"
  say "making $base with debootstrap from $mirror"
  debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
    || { echo "docker: FAIL: debootstrap:"; tail "$work/debootstrap.log"; exit 1; }
  tar -C "$work/rootfs" -c . | docker import - "$base" >/dev/null
  rm -rf "$work/rootfs"
fi

