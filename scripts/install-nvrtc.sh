#!/usr/bin/env bash
# Installs NVRTC, the CUDA runtime compiler, from the PyPI wheel `nvidia-cuda-nvrtc-cu12`, so
# that the tests can compile murmur's CUDA kernels to PTX on a machine without a GPU or a
# CUDA toolkit. Prints one line on stdout: the directory holding libnvrtc.so.12 and
# libnvrtc-builtins.so. Progress goes to stderr. Safe to run repeatedly: when the library is
# already there it only prints the directory.
#
#   export LD_LIBRARY_PATH="$(scripts/install-nvrtc.sh)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
#
# cudarc opens NVRTC by its library name (libnvrtc.so, libnvrtc.so.12, ...), so the
# directory must be on the dynamic loader's path when a process starts. The NVRTC compile
# test (gpu/tests/nvrtc_compile.rs) finds the default install location by itself and
# re-runs itself with it on LD_LIBRARY_PATH; other programs need the export above.
#
# Environment:
#   MURMUR_NVRTC_DIR      where to install (default: <repo>/target/nvrtc, ignored by git)
#   MURMUR_NVRTC_VERSION  the wheel version (default: 12.8.93, matching cudarc's cuda-12080)
#   PYTHON                the Python whose pip installs the wheel (default: python3)
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
prefix="${MURMUR_NVRTC_DIR:-$repo/target/nvrtc}"
version="${MURMUR_NVRTC_VERSION:-12.8.93}"
python="${PYTHON:-python3}"
lib_dir="$prefix/nvidia/cuda_nvrtc/lib"

if [[ -e "$lib_dir/libnvrtc.so.12" && -e "$prefix/.version-$version" ]]; then
  echo "$lib_dir"
  exit 0
fi

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64 | Linux-aarch64) ;;
  *)
    echo "install-nvrtc: the nvidia-cuda-nvrtc-cu12 wheel exists for Linux x86_64 and aarch64 only" >&2
    exit 1
    ;;
esac

if ! "$python" -m pip --version >/dev/null 2>&1; then
  echo "install-nvrtc: $python has no pip; install python3-pip or set PYTHON" >&2
  exit 1
fi

echo "install-nvrtc: installing nvidia-cuda-nvrtc-cu12==$version into $prefix" >&2
rm -rf "$prefix"
mkdir -p "$prefix"
"$python" -m pip install --quiet --disable-pip-version-check --no-deps \
  --target "$prefix" "nvidia-cuda-nvrtc-cu12==$version" >&2

if [[ ! -e "$lib_dir/libnvrtc.so.12" ]]; then
  echo "install-nvrtc: the wheel did not provide $lib_dir/libnvrtc.so.12" >&2
  exit 1
fi
touch "$prefix/.version-$version"
echo "$lib_dir"
