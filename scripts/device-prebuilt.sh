#!/usr/bin/env bash
# Packs the binaries that the device phases run (the dcp command, the CUDA kernel tests, the
# one-GPU whole-plan check, the kernel benchmark) from a CMake build of this machine into DIR
# (default .devcarry/bin, ignored by git), with every shared library they load that the GPU
# machine does not have, so that a device call skips its build:
#   scripts/device-prebuilt.sh build
#   PREBUILT=.devcarry/bin bash bench/run_package_device.sh .devcarry/deps checks kernels plans
# (carry .devcarry). The GPU machine (Ubuntu 24.04, ../shared/device.md) has a newer glibc and
# libstdc++ than Debian 12, Open MPI 4.1 (the same libmpi.so.40) and NCCL in its torch wheels;
# the rest (CUDA runtime, METIS, fmt, Zoltan and Scotch, the MPI C++ bindings, OpenMP) is copied.
# The build needs DCP_ENABLE_BENCH=ON (the default) and DCP_ENABLE_TESTS=ON.
set -euo pipefail
build=${1:?usage: scripts/device-prebuilt.sh BUILD_DIR [DIR]}
dir=${2:-.devcarry/bin}
bins=("$build/dcp" "$build/tests/cuda/dcp_test_cuda" "$build/tests/cuda/dcp_exec_cuda_check" "$build/bench/bench_cuda_attention")
for f in "${bins[@]}"; do
  [ -x "$f" ] || { echo "device-prebuilt: $f missing (cmake --build $build)" >&2; exit 1; }
done
rm -rf "$dir"
mkdir -p "$dir"
cp "${bins[@]}" "$dir/"
there='^(linux-vdso|ld-linux|libc\.|libm\.|libstdc\+\+|libgcc_s|libdl\.|libpthread|librt\.|libmpi\.|libopen-pal|libopen-rte|libhwloc|libevent|libudev|libz\.|libbz2|liblzma|libnccl)'
ldd "${bins[@]}" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u | while read -r name path; do
  [[ $name =~ $there ]] || cp -L "$path" "$dir/$name"
done
du -sh "$dir"
