#!/usr/bin/env bash
# tools/test --docker: the training environment as Docker images (docs/docker.md).
#  1. dockerd: uses the one running, else starts Debian's (docker.io) with vfs storage and
#     --iptables=false (it leaves the FORWARD chain and NAT alone, so tools/cluster's
#     namespace tests keep working; builds use the host's network) and stops it at the end.
#  2. debian:bookworm: made with debootstrap from this machine's Debian mirror when the
#     daemon has no such image (no registry is reachable here).
#  3. docker/Dockerfile -> tetra:cpu (layers cached between runs, in dockerd's data root).
#  4. One container trains recipes/tiny.lua for 20 steps: 20 step records, each loss within
#     1% of ln(256), the cross-entropy of its random mock tokens over a 256-token vocabulary.
#  5. Two containers as hosts on a Docker network (198.18.9.0/24): mpirun in the first
#     starts the second's ranks over ssh (tests/docker/Dockerfile.ssh, a test-only layer)
#     with -mca btl_tcp_if_include eth0, dp2 across them, and tools/compare_loss checks it
#     equals one process on loss and grad norm at every step.
# Removes its containers and network, and the images its builds replaced; keeps the
# images (tetra:cpu, its build stage tetra:cpu-build, tetra:cpu-ssh). Prints the size.
# Usage: tests/docker/run.sh   (root; exit 77 without docker when CI is not true)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
image=tetra:cpu test_image=tetra:cpu-ssh base=debian:bookworm
net=tetra-test subnet=198.18.9 hosts=(tetra-test-a tetra-test-b)
export DOCKER_BUILDKIT=0   # the legacy builder: Debian's dockerd has no buildx plugin here
started_pid="" work="$(mktemp -d)"
t0=$(date +%s)
say() { echo "docker: [$(( $(date +%s) - t0 ))s] $*"; }
skip() {
  [ "${CI:-}" = true ] && { echo "docker: FAIL: $* (CI=true)" >&2; exit 1; }
  echo "docker: skipped: $*"; exit 77
}
ours=("$image" "$image-build" "$test_image")
old_ids=""   # what our names pointed to before this run's builds
# The images this run's builds replaced, with their untagged parents (docker rmi's
# default): with vfs every layer is a full copy, and each build left about 3 GB behind.
remove_replaced() {
  local id now
  now=$(docker image inspect --format '{{.Id}}' "${ours[@]}" 2>/dev/null || true)
  for id in $old_ids; do
    grep -qx "$id" <<<"$now" || docker rmi "$id" >/dev/null 2>&1 || true
  done
}
cleanup() {
  local h
  for h in "${hosts[@]}"; do docker rm -f "$h" >/dev/null 2>&1 || true; done
  docker network rm "$net" >/dev/null 2>&1 || true
  [ -n "$old_ids" ] && remove_replaced
  declare -F stop_started_daemon >/dev/null && stop_started_daemon
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

# -- 1 and 2. The daemon and the base image ---------------------------------------------
source "$root/tests/docker/docker.bash"

# -- 3. The image ---------------------------------------------------------------------
old_ids=$(docker image inspect --format '{{.Id}}' "${ours[@]}" 2>/dev/null || true)
say "building $image (docker/Dockerfile)"
docker build -q --network host -f docker/Dockerfile -t "$image" . >"$work/build.log" 2>&1 \
  || { echo "docker: FAIL: docker build:"; tail -n 30 "$work/build.log"; exit 1; }
# Its build stage tagged too (the layers just made, so no work): the next run's build
# reuses them (the compiler and -dev packages), and replacing it frees the last one's.
docker build -q --network host -f docker/Dockerfile --target build -t "$image-build" . \
  >>"$work/build.log" 2>&1 \
  || { echo "docker: FAIL: docker build --target build:"; tail -n 30 "$work/build.log"; exit 1; }
docker run --rm --entrypoint sh "$image" -c \
  '! command -v cc && ! command -v gcc && ! command -v cmake && command -v mpirun >/dev/null' >/dev/null \
  || { echo "docker: FAIL: $image carries a compiler or lacks mpirun"; exit 1; }
say "$image: $(docker image ls --format '{{.Size}}' "$image")"

# -- 4. One container trains ----------------------------------------------------------
docker run --rm -v "$work:/out" -e OMP_NUM_THREADS=1 "$image" run recipes/tiny.lua \
  --set train.steps=20 --set log.metrics_file=/out/single.jsonl >"$work/single.log" 2>&1 \
  || { echo "docker: FAIL: training in $image:"; tail -n 20 "$work/single.log"; exit 1; }
awk 'match($0, /"loss"[ \t]*:[ \t]*-?[0-9.eE+-]+/) {
       v = substr($0, RSTART, RLENGTH); sub(/^[^:]*:[ \t]*/, "", v); loss[++n] = v + 0 }
     END {
       if (n != 20) { print "docker: FAIL: " n " steps in the metrics, want 20"; exit 1 }
       for (i = 1; i <= n; i++) if (!(loss[i] > 0.99 * log(256) && loss[i] < 1.01 * log(256))) {
         print "docker: FAIL: step " i " loss " loss[i] ", want ln(256) = " log(256) " within 1%"; exit 1 }
       printf "docker: trained in a container: 20 steps, loss %.4f .. %.4f (ln 256 = %.4f)\n",
              loss[1], loss[20], log(256) }' \
  "$work/single.jsonl"

# -- 5. Two containers as hosts -------------------------------------------------------
say "building $test_image (tests/docker/Dockerfile.ssh)"
docker build -q --network host --build-arg IMAGE="$image" -f tests/docker/Dockerfile.ssh \
  -t "$test_image" tests/docker >"$work/build-ssh.log" 2>&1 \
  || { echo "docker: FAIL: docker build (ssh layer):"; tail -n 30 "$work/build-ssh.log"; exit 1; }
docker network rm "$net" >/dev/null 2>&1 || true
docker network create --subnet "$subnet.0/24" "$net" >/dev/null
i=2
for h in "${hosts[@]}"; do
  # Fixed addresses and /etc/hosts entries: Docker's embedded DNS needs its iptables rules.
  docker run -d --name "$h" --hostname "$h" --network "$net" --ip "$subnet.$i" \
    --add-host "${hosts[0]}:$subnet.2" --add-host "${hosts[1]}:$subnet.3" \
    -v "$work:/out" -v "$root/tools/compare_loss:/test/compare_loss:ro" "$test_image" >/dev/null
  i=$((i + 1))
done
mpi="-H ${hosts[0]}:1,${hosts[1]}:1 -mca btl tcp,self -mca btl_tcp_if_include eth0"
mpi="$mpi -mca oob_tcp_if_include eth0 -x OMP_NUM_THREADS=1"
# mpirun in the first container starts a rank in each (the second's through ssh and orted).
for _ in $(seq 20); do
  ran=$(docker exec "${hosts[0]}" mpirun $mpi -np 2 hostname 2>"$work/hostname.log" | sort | tr '\n' ' ') || true
  [ "$ran" = "${hosts[0]} ${hosts[1]} " ] && break
  sleep 1   # sshd may still be starting
done
[ "$ran" = "${hosts[0]} ${hosts[1]} " ] \
  || { echo "docker: FAIL: mpirun across the containers ran on '$ran':"; cat "$work/hostname.log"; exit 1; }
if docker exec -w /opt/tetra/share/tetra -e OMP_NUM_THREADS=1 "${hosts[0]}" \
     bash /test/compare_loss --tetra /opt/tetra/bin/tetra --np 2 --mpirun "$mpi" \
     --layout parallel.data_parallel_size=2 --out /out/dp2 recipes/tiny.lua \
     --set train.steps=10 >"$work/dp2.log" 2>&1; then
  tail -n 1 "$work/dp2.log"
else
  echo "docker: FAIL: dp2 across two containers differs from one process (or failed):"
  cat "$work/dp2.log"; cat "$work/dp2/distributed.log" 2>/dev/null || true
  exit 1
fi
say "ok (images kept in dockerd's data root: $(docker info --format '{{.DockerRootDir}}'))"
