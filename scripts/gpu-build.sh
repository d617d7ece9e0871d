#!/usr/bin/env bash
# Builds, on a machine without a GPU, everything scripts/gpu-check.sh runs on a GPU host, into
# one folder to copy there (default target/gpu-check/bundle, under 60 MiB):
#
#   gpu-tests.tar.zst  a nextest archive of murmur-gpu's tests, default build (release): the
#                      communication kernels, loaded through cudarc at run time
#   trainer-device.xz  murmur-trainer's `device` test, `cuda` build: GPU loss and gradient
#                      against the CPU's on the GPT and the MLP
#   murmur.xz          the daemon, `cuda` build: `bench codecs --device cuda`, `bench train`,
#                      and `murmur run` with `training.device = "cuda"`
#   cargo-nextest.xz   the runner for the archive (the GPU host needs no Rust)
#
# The executables are stripped and xz-compressed; gpu-check.sh unpacks them.
#
#   scripts/gpu-build.sh            # everything; then carry target/gpu-check/bundle over
#   scripts/gpu-build.sh cuda       # only the `cuda` build (tests: only the archive)
#
# The `cuda` build links libcuda.so, which belongs to the NVIDIA driver, not to the toolkit.
# Without a driver here, the script compiles a stub libcuda.so that defines every `cu*`
# function cudarc declares, puts it on the linker's path only (LIBRARY_PATH), and gives it
# the driver's soname, libcuda.so.1, so that the binaries load the GPU host's real driver.
# The stub is never copied into the bundle.
#
# The `cuda` build goes to its own target directory (target/cuda) so that neither build
# invalidates the other. A clean one took about 21 minutes on two cores, half of it nvcc
# compiling candle's kernels; later runs rebuild only what changed (a few minutes).
#
# Environment:
#   MURMUR_GPU_CHECK_DIR    where the bundle goes (default: <repo>/target/gpu-check)
#   MURMUR_CUDA_TARGET_DIR  the `cuda` build's target directory (default: <repo>/target/cuda)
#   MURMUR_CUDA_DIR         where the CUDA toolkit is installed (scripts/install-cuda-toolkit.sh)
#   CUDA_COMPUTE_CAP        the GPU architecture (default: 90, H100 and H200)
#   NICE                    the niceness of the builds (default: 19)
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
out="${MURMUR_GPU_CHECK_DIR:-$repo/target/gpu-check}"
bundle="$out/bundle"
stub_dir="$out/libcuda-stub"
nice_level="${NICE:-19}"
cd "$repo"

stage="${1:-all}"
case "$stage" in
  all | tests | cuda) ;;
  *)
    echo "usage: $0 [all|tests|cuda]" >&2
    exit 2
    ;;
esac

log() { echo "gpu-build: $*" >&2; }

mkdir -p "$bundle"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# --- 1. murmur-gpu's tests, default build, as a nextest archive -------------------------------
build_tests() {
  if ! command -v cargo-nextest >/dev/null; then
    log "cargo-nextest is not installed (cargo install cargo-nextest --locked)"
    exit 1
  fi
  log "archiving murmur-gpu's tests (default build, release, stripped)"
  # A target directory of its own: stripping changes the release profile, which would
  # otherwise rebuild target/release for everything else.
  CARGO_TARGET_DIR="$out/tests-target" CARGO_PROFILE_RELEASE_DEBUG=false \
    CARGO_PROFILE_RELEASE_STRIP=symbols nice -n "$nice_level" \
    cargo nextest archive --release --locked -p murmur-gpu \
    --archive-file "$bundle/gpu-tests.tar.zst"
  pack "$(command -v cargo-nextest)" cargo-nextest
}

# Copies the executable `path` into the bundle as `name.xz`, stripped and compressed (the
# CUDA kernels candle embeds are most of the `cuda` binaries and compress about 7:1).
pack() {
  local path="$1" name="$2"
  cp "$path" "$work/$name"
  strip "$work/$name"
  xz -9 -T0 -c "$work/$name" >"$bundle/$name.xz"
  rm "$work/$name"
}

# --- 2. a link-time stub of the driver library, when this host has no driver ------------------
link_stub() {
  local driver cudarc_dir bindings
  driver="$(/sbin/ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*(x86-64|AArch64)/ { print $NF; exit }')"
  if [[ -n "$driver" ]]; then
    return
  fi
  cudarc_dir="$(cargo metadata --format-version 1 --locked |
    python3 -c 'import json, os, sys
print(next(os.path.dirname(p["manifest_path"]) for p in json.load(sys.stdin)["packages"] if p["name"] == "cudarc"))')"
  bindings="$cudarc_dir/src/driver/sys/mod.rs"
  if [[ ! -f "$bindings" ]]; then
    log "cannot find cudarc's driver bindings (looked for $bindings)"
    exit 1
  fi
  mkdir -p "$stub_dir"
  # Every driver entry point cudarc declares. The bodies never run (the host's libcuda.so.1
  # is loaded instead); each returns CUDA_ERROR_STUB_LIBRARY (34) in case one ever does.
  grep -oE 'pub unsafe fn cu[A-Za-z0-9_]+' "$bindings" | awk '{ print $4 }' | sort -u |
    awk '{ printf "int %s(void) { return 34; }\n", $1 }' >"$stub_dir/libcuda.c"
  gcc -shared -fPIC -O0 -Wl,-soname,libcuda.so.1 -o "$stub_dir/libcuda.so" "$stub_dir/libcuda.c"
  log "no NVIDIA driver here: linking against a stub libcuda.so ($(wc -l <"$stub_dir/libcuda.c") functions)"
  # gcc searches LIBRARY_PATH for -lcuda; cargo does not track it, so no rebuild follows.
  export LIBRARY_PATH="$stub_dir${LIBRARY_PATH:+:$LIBRARY_PATH}"
}

# --- 3. the `cuda` build: the trainer's device test and the daemon -----------------------------
build_cuda() {
  local messages executables name path
  eval "$(scripts/install-cuda-toolkit.sh)"
  export CARGO_TARGET_DIR="${MURMUR_CUDA_TARGET_DIR:-$repo/target/cuda}"
  log "building the cuda build in $CARGO_TARGET_DIR (CUDA_COMPUTE_CAP=$CUDA_COMPUTE_CAP)"
  messages="$out/cuda-build.json"
  # One cargo invocation for both, so that cudarc and candle are built once, with the
  # features of the daemon's `cuda` build.
  nice -n "$nice_level" cargo build --release --locked -p murmur -p murmur-trainer \
    --features murmur/cuda --bin murmur --test device \
    --message-format=json-render-diagnostics >"$messages"
  executables="$(python3 - "$messages" <<'EOF'
import json, sys
found = {}
for line in open(sys.argv[1]):
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
        continue
    target = msg["target"]
    if target["name"] == "murmur" and "bin" in target["kind"]:
        found["murmur"] = msg["executable"]
    elif target["name"] == "device" and "test" in target["kind"]:
        found["trainer-device"] = msg["executable"]
for name in ("murmur", "trainer-device"):
    print(name, found[name])
EOF
  )"
  while read -r name path; do
    pack "$path" "$name"
  done <<<"$executables"
}

if [[ "$stage" != cuda ]]; then
  build_tests
fi
if [[ "$stage" != tests ]]; then
  link_stub
  build_cuda
fi

# --- 4. what to carry --------------------------------------------------------------------------
du -b "$bundle"/* | awk '{ printf "gpu-build: %8.1f MiB  %s\n", $1 / 1048576, $2 }' >&2
total="$(du -cb "$bundle"/* | awk 'END { print $1 }')"
log "bundle: $bundle, $((total / 1048576)) MiB in all"
if ((total > 60 * 1048576)); then
  log "the bundle is over 60 MiB"
  exit 1
fi
echo "$bundle"
