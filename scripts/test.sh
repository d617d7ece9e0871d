#!/usr/bin/env bash
# Everything CI checks, in the order a failure is cheapest to find: formatting, lints,
# docs, doc tests, then the test suite (which also replays the fuzz corpora).
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
cargo test --workspace --doc --locked
cargo nextest run --workspace --locked --no-fail-fast
