#!/usr/bin/env bash
# Installs the parts of the CUDA 13.0 toolkit that `--features cuda` builds need (nvcc, the
# CUDA headers, CCCL, and the libraries candle's CUDA backend links: cudart, cuBLAS, cuRAND,
# NVRTC) from NVIDIA's PyPI wheels, without root and without a system toolkit. Prints the
# environment to export on stdout; progress goes to stderr. Safe to run repeatedly.
#
#   eval "$(scripts/install-cuda-toolkit.sh)"
#   cargo build --release -p murmur-trainer --features cuda
#
# Why CUDA 13: the CUDA 12 wheel `nvidia-cuda-nvcc-cu12` ships ptxas but not the `nvcc`
# driver; the first nvcc on PyPI is `nvidia-cuda-nvcc` 13.0. Kernels built with it need an
# NVIDIA driver for CUDA 13 (580 or newer; `nvidia-smi` shows "CUDA Version: 13.x") on the
# host that runs them. For an older driver, build with a system CUDA 12.x toolkit instead
# (docs/gpu.md).
#
# The wheels give the shared libraries only under their versioned names (libcublas.so.13);
# the linker looks for libcublas.so, so the script adds those links. libcuda.so belongs to
# the driver, not the toolkit: when the driver is installed (ldconfig knows libcuda.so.1) the
# script links it too; without a driver, library crates build but test and binary targets
# do not link.
#
# Environment:
#   MURMUR_CUDA_DIR    where to install (default: <repo>/target/cuda-toolkit, ignored by git)
#   CUDA_COMPUTE_CAP   the GPU architecture to compile for, printed back in the exports
#                      (default: 90, for H100 and H200; 80 for A100, 89 for L4/L40/RTX 40xx)
#   PYTHON             the Python whose pip installs the wheels (default: python3)
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
prefix="${MURMUR_CUDA_DIR:-$repo/target/cuda-toolkit}"
python="${PYTHON:-python3}"
compute_cap="${CUDA_COMPUTE_CAP:-90}"

# One CUDA release (13.0 update 2); the wheels of different releases do not mix.
release="13.0.2"
wheels=(
  "nvidia-cuda-nvcc==13.0.88"    # nvcc, ptxas, fatbinary, nvlink
  "nvidia-nvvm==13.0.88"         # cicc and libdevice, which nvcc runs
  "nvidia-cuda-crt==13.0.88"     # crt/ headers nvcc includes
  "nvidia-cuda-runtime==13.0.96" # cuda.h, cuda_runtime.h, cuda_fp16.h..., libcudart
  "nvidia-cuda-cccl==13.0.85"    # cub, thrust, libcu++ (candle's sort kernels)
  "nvidia-cuda-nvrtc==13.0.88"   # libnvrtc (cudarc links it)
  "nvidia-cublas==13.0.2.14"     # libcublas, libcublasLt (candle's matmuls)
  "nvidia-curand==10.4.0.35"     # libcurand (candle's random tensors)
)
root="$prefix/nvidia/cu13"
lib="$root/lib"
stamp="$prefix/.release-$release"

log() { echo "install-cuda-toolkit: $*" >&2; }

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64 | Linux-aarch64) ;;
  *)
    log "NVIDIA's CUDA wheels exist for Linux x86_64 and aarch64 only"
    exit 1
    ;;
esac

if [[ ! -x "$root/bin/nvcc" || ! -e "$stamp" ]]; then
  if ! "$python" -m pip --version >/dev/null 2>&1; then
    log "$python has no pip; install python3-pip or set PYTHON"
    exit 1
  fi
  log "installing CUDA $release wheels into $prefix (about 1 GB)"
  rm -rf "$prefix"
  mkdir -p "$prefix"
  # --no-deps: the wheels' own requirements are unpinned and would pull the newest release.
  "$python" -m pip install --quiet --disable-pip-version-check --no-deps \
    --target "$prefix" "${wheels[@]}" >&2
  touch "$stamp"
fi

for file in bin/nvcc nvvm/bin/cicc include/cuda_runtime.h include/cccl/cub/cub.cuh; do
  if [[ ! -e "$root/$file" ]]; then
    log "the wheels did not provide $root/$file"
    exit 1
  fi
done

# Unversioned names for the linker (-lcudart -lcublas -lcublasLt -lcurand -lnvrtc).
for name in cudart cublas cublasLt curand nvrtc; do
  versioned="$(cd "$lib" && ls "lib$name.so."* 2>/dev/null | sort | head -n 1)"
  if [[ -z "$versioned" ]]; then
    log "no lib$name.so.* in $lib"
    exit 1
  fi
  ln -sfn "$versioned" "$lib/lib$name.so"
done

# -lcuda: the driver's library, if this host has one.
driver="$(/sbin/ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64|libcuda\.so\.1 .*AArch64/ { print $NF; exit }')"
if [[ -n "$driver" ]]; then
  ln -sfn "$driver" "$lib/libcuda.so"
else
  rm -f "$lib/libcuda.so"
  log "no NVIDIA driver here (ldconfig has no libcuda.so.1): library crates build, but"
  log "tests and binaries with --features cuda link only on a host with the driver"
fi

"$root/bin/nvcc" --version | tail -n 2 | sed 's/^/install-cuda-toolkit: /' >&2

cat <<EOF
export CUDA_HOME='$root'
export CUDA_PATH='$root'
export CUDA_ROOT='$root'
export NVCC='$root/bin/nvcc'
export PATH='$root/bin':"\$PATH"
export LD_LIBRARY_PATH='$lib'"\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export CUDA_COMPUTE_CAP='$compute_cap'
EOF
