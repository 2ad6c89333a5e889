#!/usr/bin/env bash
# tests/gpu_check/bare_root.sh CACHE_DIR — tools/gpu-check's set-up on a machine that has
# only what a GPU machine has: a root directory made with `dpkg -x` from Debian's
# toolchain packages alone (C library, gcc/g++, make, CMake, bash, coreutils, dpkg: no
# LuaJIT, OpenBLAS, Open MPI, libyaml, Criterion, libedit, not even pkg-config), with this
# machine's /usr/local/cuda mounted in it. Inside that root, `tools/gpu-check setup` must
# unpack the carried .debs, configure with TETRA_REQUIRE_CUDA=ON, build what it runs for
# sm_90a and find every CUDA test of tests/cuda/ built; then the CUDA test programs must
# start there and skip for want of a GPU (exit 77), which shows they link and load against
# the carried libraries alone, and tetra must open cuBLASLt there (it is not linked).
#
# The .debs (gpu-check's own list, and the toolchain) are downloaded with apt into
# CACHE_DIR once and reused. Needs root (chroot, mounts), apt and nvcc; the build inside
# takes about 2 minutes on 2 cores, up to 5 when they are busy.
set -euo pipefail
CACHE=${1:?usage: bare_root.sh CACHE_DIR}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
NVCC=/usr/local/cuda/bin/nvcc

[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root (chroot and bind mounts)"; exit 77; }
for tool in apt-get apt-cache dpkg unshare chroot ldconfig; do
  command -v "$tool" > /dev/null || { echo "SKIP: $tool is not installed"; exit 77; }
done
[ -x "$NVCC" ] || { echo "SKIP: no $NVCC (the set-up builds the CUDA backend)"; exit 77; }

mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
WORK=$(mktemp -d "$CACHE/run.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# -- The .debs, downloaded once --------------------------------------------------------
# A list is downloaded again only when it changes (a stamp file holds the list it made).
download() {   # download DIR PACKAGES...
  local dir=$1
  shift
  local want
  want=$(printf '%s\n' "$@" | sort -u)
  if [ -f "$dir/.stamp" ] && [ "$(cat "$dir/.stamp")" = "$want" ]; then return 0; fi
  rm -rf "$dir" && mkdir -p "$dir"
  (cd "$dir" && apt-get download $want > /dev/null)
  echo "$want" > "$dir/.stamp"
}
TOOLCHAIN="bash coreutils dash dpkg grep sed mawk findutils gzip tar xz-utils diffutils make
           cmake gcc g++ libc6-dev"
toolchain=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
              --no-breaks --no-replaces --no-enhances $TOOLCHAIN | grep -E '^[a-z0-9]' | sort -u)
download "$CACHE/toolchain" $toolchain
if [ ! -f "$CACHE/carried/.done" ] || [ "$SRC/tools/gpu-check" -nt "$CACHE/carried/.done" ]; then
  rm -rf "$CACHE/carried"
  TETRA_GPU_DEBS="$CACHE/carried" "$SRC/tools/gpu-check" fetch > "$WORK/fetch.log" 2>&1 ||
    { cat "$WORK/fetch.log"; echo "FAIL: tools/gpu-check fetch"; exit 1; }
  touch "$CACHE/carried/.done"
fi

# -- The bare root ---------------------------------------------------------------------
R=$WORK/root
mkdir -p "$R"
for f in "$CACHE"/toolchain/*.deb; do dpkg -x "$f" "$R"; done
# Merged /usr as on every current distribution, then the loader's cache.
for d in bin sbin lib lib64; do
  if [ -d "$R/$d" ] && [ ! -L "$R/$d" ]; then
    mkdir -p "$R/usr/$d"
    cp -a "$R/$d/." "$R/usr/$d/"
    rm -rf "${R:?}/$d"
  fi
  ln -sfn "usr/$d" "$R/$d"
done
ldconfig -r "$R"
mkdir -p "$R/usr/local/cuda" "$R/proc" "$R/dev" "$R/tmp" "$R/src" "$R/debs" "$R/out"
chmod 1777 "$R/tmp"

# The root must lack what gpu-check carries, or this test proves nothing.
for absent in usr/bin/pkg-config usr/include/luajit-2.1 usr/include/cblas.h \
              usr/include/criterion usr/lib/x86_64-linux-gnu/libyaml.so; do
  [ ! -e "$R/$absent" ] || { echo "FAIL: the bare root already has /$absent"; exit 1; }
done

# The sources as they would travel: tracked and untracked-but-not-ignored files.
(cd "$SRC" && git ls-files -co --exclude-standard | while IFS= read -r f; do
   [ -e "$f" ] && printf '%s\n' "$f"; done | tar -cf - -T -) | tar -xf - -C "$R/src"

# -- gpu-check's set-up inside it ------------------------------------------------------
cat > "$WORK/inside.sh" <<'EOF'
set -u
export TETRA_GPU_DEBS=/debs TETRA_GPU_BUILD=/tmp/build-gpu
# 2 busy cores, not the GPU machine's 16: caps and budget five times as large.
export TETRA_GPU_CHECK_CAP_SCALE=5 TETRA_GPU_CHECK_BUDGET_S=2400
/src/tools/gpu-check setup /out || exit 1
# Each CUDA test program, in the environment gpu-check leaves in env.sh: exit 77 (no GPU
# here) after loading every library it needs.
source /out/env.sh
for t in /tmp/build-gpu/cuda_test_*; do
  (cd /tmp && "$t" --jobs=1 > "/out/$(basename "$t").run.log" 2>&1)
  rc=$?
  echo "$(basename "$t"): exit $rc"
  [ "$rc" -eq 77 ] || { cat "/out/$(basename "$t").run.log"; exit 1; }
done
# cuBLASLt, which the engine opens on first use rather than links, opens here too.
/tmp/build-gpu/tetra -e 'local tffi = require("tetra.ffi"); tffi.cdef_header("tetra_cuda.h")
  local ok = tffi.C.tt_blaslt_loaded()
  print(ok == 1 and "cuBLASLt: opened" or "cuBLASLt: " .. require("ffi").string(tffi.C.tt_last_error()))
  os.exit(ok == 1 and 0 or 1)' || exit 1
EOF
set +e
unshare -m bash -c '
  set -e
  R=$1
  mount --bind /usr/local/cuda "$R/usr/local/cuda"
  mount -o remount,bind,ro "$R/usr/local/cuda"
  mount --bind "$2" "$R/debs"
  mount -t proc proc "$R/proc"
  mount --rbind /dev "$R/dev"
  cp "$3" "$R/tmp/inside.sh"
  exec chroot "$R" /usr/bin/env -i PATH=/usr/local/cuda/bin:/usr/bin:/bin HOME=/tmp \
    /bin/bash /tmp/inside.sh' bare_root "$R" "$CACHE/carried" "$WORK/inside.sh" 2>&1 |
  tee "$WORK/inside.log"
rc=${PIPESTATUS[0]}
set -e
cp "$R"/out/*.log "$R"/out/*.txt "$R/out/env.sh" "$CACHE/" 2> /dev/null || true
[ "$rc" -eq 0 ] || { echo "FAIL: gpu-check setup in the bare root (rc $rc); logs in $CACHE"; exit 1; }
grep -qE '^built +ok .*CUDA tests' "$R/out/summary.txt" ||
  { echo "FAIL: the summary does not report the CUDA tests built"; exit 1; }
want=$(ls "$SRC"/tests/cuda/test_*.c | wc -l)
ran=$(grep -c ': exit 77$' "$WORK/inside.log" || true)
[ "$ran" -eq "$want" ] || { echo "FAIL: $ran of $want CUDA test programs started in the bare root"; exit 1; }
echo "PASS: bare root: gpu-check set-up built and registered every CUDA test; $ran programs load"
