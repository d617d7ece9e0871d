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
