#!/bin/sh
# The steps both images run (docker/Dockerfile on Debian 12, docker/Dockerfile.cuda on
# NVIDIA's CUDA image): one script so the CPU and GPU images cannot drift apart.
#   build-steps.sh build-deps      the compiler and -dev packages tools/setup installs for a
#                                  build (less its test-only tools)
#   build-steps.sh build CUDA      cmake build of the tetra binary (CUDA: ON or OFF), installed
#                                  under /opt/tetra (bin/tetra, share/tetra/{lua,engine,recipes}),
#                                  with /opt/tetra/runtime-packages: the packages that own the
#                                  shared libraries ldd finds in the binary
#   build-steps.sh runtime-deps    in the slim stage: those packages plus Open MPI's launcher
#                                  (openmpi-bin: mpirun, orted) and oneDNN (libdnnl2, loaded
#                                  when chosen), nothing else
set -eu
export DEBIAN_FRONTEND=noninteractive

apt_install() {
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "$@" >/dev/null
  rm -rf /var/lib/apt/lists/*
}

case "$1" in
  build-deps)
    apt_install build-essential cmake pkg-config ca-certificates \
      luajit libluajit-5.1-dev libopenblas-dev libopenmpi-dev openmpi-bin \
      libyaml-dev libedit-dev libcurl4-openssl-dev libxml2-dev libmicrohttpd-dev ;;
  build)
    cmake -S /src -B /build -DCMAKE_BUILD_TYPE=Release -DTETRA_CUDA="$2" >/dev/null
    cmake --build /build --target tetra -j"$(nproc)"
    cmake --install /build --prefix /opt/tetra >/dev/null
    # Which packages the binary needs at run time: the owner of each library ldd resolves
    # (through alternatives' symlinks to the real file; Debian and Ubuntu merge /lib into
    # /usr/lib, so dpkg may know either path).
    : > /opt/tetra/runtime-packages
    for lib in $(ldd /opt/tetra/bin/tetra | awk '$3 ~ /^\// { print $3 }'); do
      real=$(readlink -f "$lib")
      owner=""
      for p in "$lib" "$real" "/usr$real" "${real#/usr}"; do
        owner=$(dpkg -S "$p" 2>/dev/null | head -n 1 | cut -d: -f1) && [ -n "$owner" ] && break
      done
      [ -n "$owner" ] || { echo "build-steps.sh: no package owns $lib" >&2; exit 1; }
      echo "$owner" >> /opt/tetra/runtime-packages
    done
    sort -u -o /opt/tetra/runtime-packages /opt/tetra/runtime-packages
    echo "runtime packages: $(tr '\n' ' ' < /opt/tetra/runtime-packages)" ;;
  runtime-deps)
    # shellcheck disable=SC2046
    # libdnnl2: loaded when chosen (dlopen, so ldd cannot see it): the matmul library tetra
    # picks on Intel CPUs with AVX-512
    apt_install openmpi-bin libdnnl2 $(cat /opt/tetra/runtime-packages) ;;
  *) echo "usage: build-steps.sh build-deps | build ON|OFF | runtime-deps" >&2; exit 2 ;;
esac
