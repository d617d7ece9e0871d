#!/usr/bin/env bash
# Installs what the README's commands need on a fresh machine. Safe to run repeatedly:
# each step checks first and does nothing when its tool is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo nextest --version >/dev/null 2>&1; then
  echo "setup: installing cargo-nextest" >&2
  cargo install cargo-nextest --locked
fi

# NVRTC from PyPI, so the CUDA kernels compile to PTX in tests on machines without a GPU.
./scripts/install-nvrtc.sh >/dev/null

# promtool (Debian's `prometheus` package) lints the /metrics output in the daemon's tests.
if ! command -v promtool >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing promtool (Debian package prometheus)" >&2
    sudo_cmd=""
    if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends prometheus
  else
    echo "setup: promtool not found and no apt-get; install Prometheus's promtool by hand" >&2
  fi
fi

# DejaVu Sans for the text of `murmur local`'s loss.png (without it the plot has no text).
if [ ! -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] && command -v apt-get >/dev/null 2>&1; then
  echo "setup: installing fonts-dejavu-core" >&2
  sudo_cmd=""
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi
  { $sudo_cmd apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends fonts-dejavu-core; } \
    || echo "setup: could not install fonts-dejavu-core; loss.png will have no text" >&2
fi

# ip, tc (iproute2), ping (iputils-ping) and nft (nftables): the network-namespace harness in
# tests/netns and the NAT tests (daemon/tests/run_nat.rs).
netns_packages=""
if ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; then netns_packages="iproute2"; fi
if ! command -v ping >/dev/null 2>&1; then netns_packages="$netns_packages iputils-ping"; fi
if ! command -v nft >/dev/null 2>&1; then netns_packages="$netns_packages nftables"; fi
if [ -n "$netns_packages" ]; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing ${netns_packages# }" >&2
    sudo_cmd=""
    if [ "$(id -u)" -ne 0 ]; then sudo_cmd="sudo"; fi
    # shellcheck disable=SC2086 # the package list is meant to split
    { $sudo_cmd apt-get update -qq \
        && DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends $netns_packages >/dev/null; } \
      || echo "setup: could not install ${netns_packages# }; the tests in tests/netns will fail" >&2
  else
    echo "setup: install iproute2, iputils-ping and nftables by hand for the tests in tests/netns" >&2
  fi
fi

# Python's safetensors (numpy backend): the daemon's export test loads the exported model with it.
if ! python3 -c "import safetensors, numpy" >/dev/null 2>&1; then
  if command -v python3 >/dev/null 2>&1; then
    echo "setup: installing the Python packages safetensors and numpy" >&2
    python3 -m pip install --quiet safetensors numpy \
      || echo "setup: could not install safetensors and numpy; the export test will fail" >&2
  else
    echo "setup: python3 not found; the export test needs python3 with safetensors and numpy" >&2
  fi
fi
