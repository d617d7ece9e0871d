#!/usr/bin/env bash
# Runs every GPU test and the GPU benchmarks on a GPU host, from the binaries that
# scripts/gpu-build.sh made on another machine, and prints one summary. The host needs the
# NVIDIA driver (CUDA 13: driver 580 or newer) and the CUDA 13 libraries (cuBLAS, cuBLASLt,
# cuRAND, cudart, NVRTC) from a system toolkit or NVIDIA's pip wheels; no Rust, no network.
#
#   scripts/gpu-build.sh                         # on the build machine
#   # copy the repository and target/gpu-check/bundle to the GPU host, then there:
#   bash scripts/gpu-check.sh [BUNDLE]           # default target/gpu-check/bundle
#
# What runs (each bounded by `timeout`; about ten minutes on an H100 host, the last check
# half of it):
#   gpu-tests       murmur-gpu's tests, ignored GPU tests included, with MURMUR_REQUIRE_GPU=1
#                   and MURMUR_REQUIRE_NVRTC=1 so that none can fall back or skip
#   trainer-device  the `cuda` build's GPU-against-CPU loss and gradient test (GPT and MLP)
#   bench-codecs    `murmur bench codecs --device cuda`: the int8 row in the summary
#   tokens/s        `murmur bench train` on GPU 0 and on one CPU core, same model
#   mixed-pair      `murmur local`, two peers in SGP with int8 shares on the quality task: one
#                   on GPU 0 and one on the CPU must end within 1 % of two CPU peers' eval
#                   loss (a solo run, no averaging, is printed beside them for scale)
#   run-cuda        `murmur run` with training.device = "cuda": the ready log line, /status
#                   and /metrics say cuda:0, it trains, the murmur_gpu_* metrics are live
#                   (memory in use, seconds in the passes), and it stops cleanly on SIGINT
#   run-auto        training.device = "auto" takes cuda:0
#   run-bad-gpu     training.device = "cuda:63" (no such GPU) exits 2 naming the key
#   sgp-124m        `murmur local`, two GPU peers on a 124M-parameter GPT, SGP with int8
#                   shares and then no averaging: the step time of each, and per step the
#                   bytes the trainer moved to and from the device against the bytes it sent
#                   (measured; fails only when a run fails)
#
# Environment:
#   MURMUR_GPU_CHECK_LOGS  where each step's full output goes (default: target/gpu-check/logs)
#   CUDA_LIB_DIRS          extra folders (colon-separated) to search for the CUDA libraries
set -uo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
bundle="$(cd "${1:-$repo/target/gpu-check/bundle}" && pwd)" || {
  echo "gpu-check: no bundle at ${1:-$repo/target/gpu-check/bundle}; run scripts/gpu-build.sh" >&2
  exit 1
}
logs="${MURMUR_GPU_CHECK_LOGS:-$repo/target/gpu-check/logs}"
mkdir -p "$logs"
logs="$(cd "$logs" && pwd)"
work="$(mktemp -d)"
started=$SECONDS
summary=()
failed=0

log() { echo "gpu-check: $*" >&2; }
pass() { summary+=("PASS $*"); log "PASS $*"; }
fail() {
  summary+=("FAIL $*")
  log "FAIL $*"
  failed=$((failed + 1))
}
cleanup() {
  local pid
  for pid in $(jobs -p); do kill "$pid" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT

# The bundle's executables are xz-compressed; unpack them with xz, or Python's lzma.
bin="$work/bin"
mkdir -p "$bin"
for file in cargo-nextest.xz trainer-device.xz murmur.xz gpu-tests.tar.zst; do
  if [[ ! -e "$bundle/$file" ]]; then
    log "the bundle $bundle has no $file; run scripts/gpu-build.sh"
    exit 1
  fi
done
for name in cargo-nextest trainer-device murmur; do
  if command -v xz >/dev/null; then
    xz -dc "$bundle/$name.xz" >"$bin/$name"
  else
    python3 -c 'import lzma, shutil, sys
with lzma.open(sys.argv[1]) as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)' "$bundle/$name.xz" "$bin/$name"
  fi || {
    log "cannot unpack $bundle/$name.xz (needs xz or python3)"
    exit 1
  }
  chmod +x "$bin/$name"
done

# --- the host ----------------------------------------------------------------------------------
host="no nvidia-smi"
if command -v nvidia-smi >/dev/null; then
  host="$(nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader 2>&1 | head -n 1)"
fi
log "GPU: $host"

# --- the CUDA libraries ------------------------------------------------------------------------
# Folders that may hold them: the extra ones given, the system toolkits, and the lib folders
# of NVIDIA's pip wheels in every Python environment found.
candidate_dirs() {
  local dir
  if [[ -n "${CUDA_LIB_DIRS:-}" ]]; then tr ':' '\n' <<<"$CUDA_LIB_DIRS"; fi
  for dir in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-13* /opt/cuda; do
    [[ -n "$dir" ]] || continue
    echo "$dir/lib64"
    echo "$dir/lib"
    echo "$dir/targets/x86_64-linux/lib"
    echo "$dir/targets/sbsa-linux/lib"
  done
  echo /usr/lib/x86_64-linux-gnu
  echo /usr/lib/aarch64-linux-gnu
  {
    compgen -G "/opt/*/.venv/lib/python3*/site-packages/nvidia" || true
    compgen -G "/opt/*/lib/python3*/site-packages/nvidia" || true
    compgen -G "/usr/local/lib/python3*/dist-packages/nvidia" || true
    compgen -G "/usr/local/lib/python3*/site-packages/nvidia" || true
    compgen -G "/usr/lib/python3*/dist-packages/nvidia" || true
    compgen -G "$HOME/.local/lib/python3*/site-packages/nvidia" || true
    compgen -G "$repo/target/cuda-toolkit/nvidia" || true
    if command -v python3 >/dev/null; then
      python3 -c 'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null |
        sed 's|$|/nvidia|'
    fi
  } | while read -r nvidia; do
    [[ -d "$nvidia" ]] || continue
    for dir in "$nvidia"/*/lib; do echo "$dir"; done
  done
}
declare -A found=()
needed=(libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libnvrtc.so.13)
while read -r dir; do
  [[ -d "$dir" ]] || continue
  for lib in "${needed[@]}"; do
    if [[ -z "${found[$lib]:-}" && -e "$dir/$lib" ]]; then found[$lib]="$dir"; fi
  done
done < <(candidate_dirs)
missing=()
lib_path=""
for lib in "${needed[@]}"; do
  if [[ -z "${found[$lib]:-}" ]]; then
    missing+=("$lib")
    continue
  fi
  log "$lib in ${found[$lib]}"
  case ":$lib_path:" in
    *":${found[$lib]}:"*) ;;
    *) lib_path="${lib_path:+$lib_path:}${found[$lib]}" ;;
  esac
done
# The default build loads NVRTC at run time under the names cudarc 0.19 knows (libnvrtc.so,
# libnvrtc.so.12, ...); a CUDA 13 host has libnvrtc.so.13, so offer it as libnvrtc.so.
mkdir -p "$work/lib"
if [[ -n "${found[libnvrtc.so.13]:-}" ]]; then
  ln -s "${found[libnvrtc.so.13]}/libnvrtc.so.13" "$work/lib/libnvrtc.so"
fi
export LD_LIBRARY_PATH="$work/lib${lib_path:+:$lib_path}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ((${#missing[@]} > 0)); then
  log "not found: ${missing[*]} (set CUDA_LIB_DIRS to the folders holding them)"
fi

export MURMUR_REQUIRE_GPU=1 MURMUR_REQUIRE_NVRTC=1
unset RUST_LOG MURMUR_FAULT

# --- gpu-tests: murmur-gpu's tests from the nextest archive -------------------------------------
out="$logs/gpu-tests.log"
mkdir -p "$work/archive"
timeout 300 "$bin/cargo-nextest" nextest run --archive-file "$bundle/gpu-tests.tar.zst" \
  --workspace-remap "$repo" --extract-to "$work/archive" --run-ignored all --no-fail-fast \
  --color never >"$out" 2>&1
status=$?
# nextest's last summary line: "Summary [ 12.3s] 39 tests run: 39 passed, 0 skipped"
line="$(grep -E '^ *Summary ' "$out" | tail -n 1)"
run="$(sed -nE 's/.* ([0-9]+) tests? run: .*/\1/p' <<<"$line")"
passed="$(sed -nE 's/.* ([0-9]+) passed.*/\1/p' <<<"$line")"
if [[ $status -eq 0 && -n "$run" && "$run" == "$passed" ]]; then
  pass "gpu-tests $passed/$run"
else
  fail "gpu-tests ${passed:-0}/${run:-?} (exit $status; $out)"
fi

# --- trainer-device: the cuda build's GPU == CPU test ------------------------------------------
out="$logs/trainer-device.log"
timeout 300 "$bin/trainer-device" --include-ignored --test-threads 1 >"$out" 2>&1
status=$?
line="$(grep -E '^test result:' "$out" | tail -n 1)"
passed="$(sed -nE 's/.* ([0-9]+) passed.*/\1/p' <<<"$line")"
failed_tests="$(sed -nE 's/.* ([0-9]+) failed.*/\1/p' <<<"$line")"
if [[ $status -eq 0 && -n "$passed" ]]; then
  pass "trainer-device $passed/$((passed + failed_tests))"
else
  fail "trainer-device ${passed:-0}/$((${passed:-0} + ${failed_tests:-0})) (exit $status; $out)"
fi

# --- bench-codecs: the communication kernels on the device -------------------------------------
out="$logs/bench-codecs.log"
timeout 300 "$bin/murmur" bench codecs --device cuda >"$out" 2>&1
status=$?
# Columns: codec, enc GB/s, dec GB/s, cpy GB/s, enc/cpy, dec/cpy, B/elem.
row="$(awk '$1 == "int8:64" { print "encode " $2 " GB/s (" $5 " of copy), decode-accumulate " $3 " GB/s (" $6 "), copy " $4 " GB/s" }' "$out")"
if [[ $status -eq 0 && -n "$row" ]]; then
  pass "bench-codecs int8:64 $row"
else
  fail "bench-codecs (exit $status; $out)"
fi

# --- tokens/s: one GPU peer against one CPU core, same model -----------------------------------
# The value of the first "KEY": VALUE in JSON text, unquoted.
json_field() {
  grep -oE "\"$1\": *(\"[^\"]*\"|[^,}[:space:]]+)" <<<"$2" | head -n 1 | sed -E 's/^"[^"]*": *//; s/"//g'
}
model=(--layers 4 --width 512 --heads 8 --context 128 --batch 16)
out="$logs/bench-train.log"
gpu_json="$(timeout 200 "$bin/murmur" bench train --device cuda --steps 20 --json "${model[@]}" 2>>"$out")"
gpu_status=$?
cpu_json="$(timeout 200 "$bin/murmur" bench train --device cpu --threads 1 --steps 3 --json "${model[@]}" 2>>"$out")"
cpu_status=$?
printf '%s\n%s\n' "$gpu_json" "$cpu_json" >>"$out"
gpu_rate="$(json_field tokens_per_s "$gpu_json")"
cpu_rate="$(json_field tokens_per_s "$cpu_json")"
if [[ $gpu_status -eq 0 && $cpu_status -eq 0 && -n "$gpu_rate" && -n "$cpu_rate" ]]; then
  ratio="$(awk -v g="$gpu_rate" -v c="$cpu_rate" 'BEGIN { printf "%.1f", g / c }')"
  params="$(json_field params "$gpu_json")"
  pass "$(printf 'tokens/s gpu=%.0f cpu1=%.0f ratio=%sx (GPT 4 layers, width 512, context 128, batch 16, %s parameters; step %.1f ms vs %.1f ms)' \
    "$gpu_rate" "$cpu_rate" "$ratio" "$params" "$(json_field step_ms "$gpu_json")" "$(json_field step_ms "$cpu_json")")"
else
  fail "tokens/s (exit gpu $gpu_status, cpu $cpu_status; $out)"
fi

# --- mixed-pair: one GPU peer and one CPU peer against two CPU peers ------------------------------
# Every value of "KEY" in JSON text, in order, unquoted, one per line.
json_fields() {
  grep -oE "\"$1\": *(\"[^\"]*\"|[^,}[:space:]]+)" <<<"$2" | sed -E 's/^"[^"]*": *//; s/"//g'
}
# The quality task, where a peer alone ends clearly worse than a swarm; every step padded to
# 50 ms, so that both peers step at the same pace whatever their device. SGP's asynchrony
# moves one run's loss by about half a percent, so each pair runs three times (a CPU pair
# beside a mixed one) and the medians are compared.
pair=(--peers 2 --task quality --codec int8:64 --synthetic-step-ms 50 --json)
out="$logs/mixed-pair.log"
# Runs `murmur local` as `name` with the extra flags; its summary goes to $work/name.json.
pair_run() {
  local name="$1"
  shift
  echo "--- $name: murmur local ${pair[*]} $*" >"$work/$name.log"
  timeout 240 "$bin/murmur" local "${pair[@]}" --out "$work/$name" "$@" >"$work/$name.json" 2>>"$work/$name.log"
  cat "$work/$name.json" >>"$work/$name.log"
}
# The median of the numbers on stdin.
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
cpu_losses=()
mixed_losses=()
devices=""
for run in 1 2 3; do
  pair_run "cpu-pair-$run" --mode sgp --set training.device=cpu &
  pair_run "mixed-pair-$run" --mode sgp --set training.device=cpu --set-peer 0:training.device=cuda &
  wait
  cat "$work/cpu-pair-$run.log" "$work/mixed-pair-$run.log" >>"$out"
  cpu_losses+=("$(json_field final_eval_loss "$(cat "$work/cpu-pair-$run.json")")")
  mixed_json="$(cat "$work/mixed-pair-$run.json")"
  mixed_losses+=("$(json_field final_eval_loss "$mixed_json")")
  devices="$devices $(json_fields device "$mixed_json" | paste -sd, -)"
done
pair_run solo --mode none --set training.device=cpu
cat "$work/solo.log" >>"$out"
solo_loss="$(json_field final_eval_loss "$(cat "$work/solo.json")")"
cpu_loss="$(printf '%s\n' "${cpu_losses[@]}" | grep . | median)"
mixed_loss="$(printf '%s\n' "${mixed_losses[@]}" | grep . | median)"
valid="$(printf '%s\n' "${cpu_losses[@]}" "${mixed_losses[@]}" "$solo_loss" | grep -c .)"
if [[ "$valid" -eq 7 && "$devices" == " cuda:0,cpu cuda:0,cpu cuda:0,cpu" ]]; then
  detail="$(awk -v m="$mixed_loss" -v c="$cpu_loss" -v s="$solo_loss" -v ms="${mixed_losses[*]}" -v cs="${cpu_losses[*]}" 'BEGIN {
    d = (m - c) / c; if (d < 0) d = -d
    printf "%s median eval loss %.4f (peers cuda:0,cpu; runs %s) vs %.4f (cpu,cpu; runs %s): %.2f %% apart; solo control %.4f", (d <= 0.01 ? "ok" : "bad"), m, ms, c, cs, 100 * d, s }')"
  if [[ "$detail" == ok* ]]; then
    pass "mixed-pair ${detail#ok }"
  else
    fail "mixed-pair ${detail#bad } (over 1 %; $out)"
  fi
else
  fail "mixed-pair (losses mixed '${mixed_losses[*]}' cpu '${cpu_losses[*]}' solo '$solo_loss', devices '$devices'; $out)"
fi

# GET `path` from `addr` (HOST:PORT) with bash's /dev/tcp, bounded.
http_get() {
  timeout 10 bash -c 'exec 3<>"/dev/tcp/${1%:*}/${1##*:}"; printf "GET %s HTTP/1.0\r\n\r\n" "$2" >&3; cat <&3' _ "$1" "$2"
}

# --- murmur run on the GPU -----------------------------------------------------------------------
swarm="$work/swarm"
authority="$("$bin/murmur" swarm new --dir "$swarm" --id gpu-check 2>>"$logs/run-setup.log" |
  sed -nE 's/^authority: *//p')"

# A peer folder with a key, an invite and a config training on `device`; prints its folder.
make_peer() {
  local name="$1" device="$2" dir="$swarm/$1" peer
  peer="$("$bin/murmur" init --dir "$dir" 2>>"$logs/run-setup.log" | sed -nE 's/^peer id: *//p')"
  "$bin/murmur" swarm invite "$peer" --authority-key "$swarm/authority.key" \
    --swarm-config "$swarm/swarm.toml" --out "$dir/invite" >>"$logs/run-setup.log" 2>&1
  cat >"$dir/murmur.toml" <<EOF
[identity]
key_file = "murmur.key"

[swarm]
id = "gpu-check"
authority = "$authority"
invite_file = "invite"

[net]
listen_addrs = ["/ip4/127.0.0.1/udp/0/quic-v1"]
mdns = false

[training]
steps = 0
eval_every_steps = 50
device = "$device"

[checkpoint]
dir = "checkpoints"

[metrics]
listen = "127.0.0.1:0"

[log]
level = "info"
format = "human"
EOF
  echo "$dir"
}

# Starts `murmur run --progress` in `dir` and waits (60 s at most) for its ready line: sets
# peer_pid, and peer_addr to the metrics address (empty when the peer never got ready).
start_peer() {
  local dir="$1" waited=0
  "$bin/murmur" run --config "$dir/murmur.toml" --progress >"$dir/progress.jsonl" 2>"$dir/murmur.log" &
  peer_pid=$!
  peer_addr=""
  while ((waited < 600)); do
    peer_addr="$(grep -m 1 '"event":"ready"' "$dir/progress.jsonl" 2>/dev/null |
      grep -oE '"metrics_addr":"[^"]+"' | cut -d'"' -f4)"
    if [[ -n "$peer_addr" ]] || ! kill -0 "$peer_pid" 2>/dev/null; then break; fi
    sleep 0.1
    waited=$((waited + 1))
  done
}

# Stops the peer started last with SIGINT (30 s at most, then SIGKILL): sets peer_code to
# its exit status, or to "killed".
stop_peer() {
  local waited=0
  kill -INT "$peer_pid" 2>/dev/null
  while kill -0 "$peer_pid" 2>/dev/null && ((waited < 300)); do
    sleep 0.1
    waited=$((waited + 1))
  done
  if kill -0 "$peer_pid" 2>/dev/null; then
    kill -KILL "$peer_pid" 2>/dev/null
    wait "$peer_pid" 2>/dev/null
    peer_code="killed"
    return
  fi
  wait "$peer_pid"
  peer_code=$?
}

if [[ -z "$authority" ]]; then
  fail "run-cuda (murmur swarm new failed; $logs/run-setup.log)"
else
  # run-cuda: trains on cuda:0 and says so everywhere.
  dir="$(make_peer cuda cuda)"
  start_peer "$dir"
  if [[ -z "$peer_addr" ]]; then
    stop_peer
    fail "run-cuda (no ready line, exit '$peer_code'; $logs/run-cuda.log)"
  else
    sleep 5
    status_json="$(timeout 10 "$bin/murmur" status --addr "$peer_addr" --json 2>&1)"
    metrics="$(http_get "$peer_addr" /metrics 2>&1)"
    stop_peer
    code="$peer_code"
    device="$(json_field device "$status_json")"
    step="$(json_field step "$status_json")"
    ready="$(grep -m 1 -E ' ready[;,]? .*device=' "$dir/murmur.log")"
    gpu_used="$(sed -nE 's/^murmur_gpu_memory_used_bytes ([0-9.e+]+).*/\1/p' <<<"$metrics")"
    gpu_total="$(sed -nE 's/^murmur_gpu_memory_total_bytes ([0-9.e+]+).*/\1/p' <<<"$metrics")"
    gpu_passes="$(sed -nE 's/^murmur_gpu_kernel_seconds_total\{kernel="forward_backward"\} ([0-9.e+-]+).*/\1/p' <<<"$metrics")"
    gpu_live="$(awk -v u="${gpu_used:-0}" -v t="${gpu_total:-0}" -v k="${gpu_passes:-0}" 'BEGIN { print (u > 0 && t >= u && k > 0) ? "yes" : "no" }')"
    # Every murmur_gpu_* metric the dashboards' GPU panels name must be on the page (the
    # CPU swarms of `prometheus_real` cannot feed those panels).
    for name in $(grep -ohE 'murmur_gpu_[a-z_]+' "$repo"/dashboards/grafana/*.json | sort -u); do
      if ! grep -qE "^$name[{ ]" <<<"$metrics"; then
        gpu_live="no (dashboards name $name, not exported)"
      fi
    done
    if [[ "$device" == "cuda:0" && "${step:-0}" -gt 0 && "$ready" == *"device=cuda:0"* &&
      "$metrics" == *'murmur_training_device_info{device="cuda:0"} 1'* && "$gpu_live" == yes && "$code" == 0 ]]; then
      pass "$(awk -v s="$step" -v u="$gpu_used" -v t="$gpu_total" -v k="$gpu_passes" 'BEGIN {
        printf "run-cuda ready line, /status and /metrics say cuda:0; step %d after 5 s; GPU memory %.2f of %.1f GiB, %.2f s in forward_backward; clean exit on SIGINT", s, u / 2^30, t / 2^30, k }')"
    else
      fail "run-cuda (status device '${device}' step '${step}', GPU metrics used '${gpu_used}' total '${gpu_total}' passes '${gpu_passes}' live '${gpu_live}', exit '$code'; $logs/run-cuda.log)"
    fi
  fi
  cp "$dir/murmur.log" "$logs/run-cuda.log" 2>/dev/null
  { echo "--- /status"; echo "${status_json:-}"; echo "--- /metrics (murmur_training_*, murmur_gpu_*)"; grep -E '^murmur_(training|gpu)' <<<"${metrics:-}"; } >>"$logs/run-cuda.log"

  # run-auto: `auto` takes the GPU when the build and host have one.
  dir="$(make_peer auto auto)"
  start_peer "$dir"
  addr="$peer_addr"
  stop_peer
  code="$peer_code"
  cp "$dir/murmur.log" "$logs/run-auto.log" 2>/dev/null
  if [[ -n "$addr" && "$code" == 0 ]] && grep -qE ' ready[;,]? .*device=cuda:0' "$dir/murmur.log" && ! grep -q 'training on the CPU' "$dir/murmur.log"; then
    pass "run-auto training.device = \"auto\" took cuda:0"
  else
    fail "run-auto (exit '$code'; $logs/run-auto.log)"
  fi

  # run-bad-gpu: a GPU the host does not have is refused, exit 2, naming the key, in one
  # line (even with RUST_BACKTRACE set, which makes candle attach a backtrace to its errors).
  dir="$(make_peer bad cuda:63)"
  RUST_BACKTRACE=1 timeout 60 "$bin/murmur" run --config "$dir/murmur.toml" >/dev/null 2>"$logs/run-bad-gpu.log"
  code=$?
  if [[ $code -eq 2 && "$(wc -l <"$logs/run-bad-gpu.log")" -eq 1 ]] &&
    grep -q 'training.device = "cuda:63": cannot open CUDA GPU 63' "$logs/run-bad-gpu.log"; then
    pass "run-bad-gpu exit 2: $(head -c 160 "$logs/run-bad-gpu.log" | tr -d '\n')…"
  else
    fail "run-bad-gpu (exit $code; $logs/run-bad-gpu.log)"
  fi
fi

# --- sgp-124m: what SGP costs GPU peers of a GPT-2-small-sized model, and what crosses PCIe ---------
# Two GPU peers train a 124M-parameter GPT (GPT-2 small's 12 layers, 12 heads, width 768 and
# vocabulary, context 256) with SGP and int8 shares, then the same two without averaging
# (the control), one after the other on the same GPU. The cost of averaging is the steady
# step time of the SGP pair over the control's. While the SGP pair trains, peer 0's
# /metrics is read twice, 15 s apart: the trainer's bytes to and from the device and the
# tensor bytes it sent, per step. Checkpoints are off: a 1.5 GB write stalls a step.
# Measured, not judged: the check fails only if a run fails.
big=(--peers 2 --steps 30 --json --codec int8:64 --set training.device=cuda
  --set model.layers=12 --set model.heads=12 --set model.width=768 --set model.context=256
  --set model.vocab=50257 --set volunteer.cpu_threads=4 --set training.eval_every_steps=1000
  --set checkpoint.every_steps=1000)
out="$logs/sgp-124m.log"
: >"$out"
# The value of the series `name` (exact, labels included) on a /metrics page; "-" if absent.
metric() { awk -v n="$1" '$1 == n { v = $2 } END { print (v == "" ? "-" : v) }' <<<"$2"; }
timeout 200 "$bin/murmur" local "${big[@]}" --mode sgp --out "$work/sgp-124m" >"$work/sgp-124m.json" 2>>"$out" &
big_pid=$!
sample=()
for _ in $(seq 1 1200); do
  addr="$(grep -m 1 -oE 'serving /metrics, /status and /healthz on http://[0-9.:]+' "$work/sgp-124m/peer-0/murmur.log" 2>/dev/null | sed -E 's|.*http://||')"
  [[ -n "$addr" ]] && break
  kill -0 "$big_pid" 2>/dev/null || break
  sleep 0.1
done
if [[ -n "${addr:-}" ]]; then
  # Wait for the pair's second step, then read the page twice, 15 s apart.
  for _ in $(seq 1 1200); do
    page="$(http_get "$addr" /metrics 2>/dev/null)"
    samples="$(metric murmur_training_samples_total "$page")"
    [[ "$samples" =~ ^[0-9]+$ && "$samples" -ge 32 ]] && break
    kill -0 "$big_pid" 2>/dev/null || break
    sleep 0.25
  done
  for _ in 1 2; do
    page="$(http_get "$addr" /metrics 2>/dev/null)"
    sample+=("$(metric murmur_training_samples_total "$page") $(metric 'murmur_gpu_transfer_bytes_total{direction="to_device"}' "$page") $(metric 'murmur_gpu_transfer_bytes_total{direction="to_host"}' "$page") $(metric murmur_net_tensor_bytes_sent_total "$page")")
    echo "--- peer 0 /metrics at $(date +%T): samples, to_device, to_host, tensor bytes sent: ${sample[-1]}" >>"$out"
    grep -E '^murmur_(gpu|training_samples_total|net_tensor_bytes_sent_total|averaging_rounds_total)' <<<"$page" >>"$out"
    [[ ${#sample[@]} -eq 1 ]] && sleep 15
  done
fi
wait "$big_pid"
sgp_status=$?
timeout 200 "$bin/murmur" local "${big[@]}" --mode none --out "$work/none-124m" >"$work/none-124m.json" 2>>"$out"
none_status=$?
sgp_json="$(cat "$work/sgp-124m.json")"
none_json="$(cat "$work/none-124m.json")"
printf -- '--- sgp\n%s\n--- none\n%s\n' "$sgp_json" "$none_json" >>"$out"
cp "$work/sgp-124m/peer-0/murmur.log" "$logs/sgp-124m-peer-0.log" 2>/dev/null
sgp_rate="$(json_field steady_samples_per_s "$sgp_json")"
none_rate="$(json_field steady_samples_per_s "$none_json")"
if [[ $sgp_status -eq 0 && $none_status -eq 0 && -n "$sgp_rate" && -n "$none_rate" ]]; then
  pcie="$(awk -v a="${sample[0]:-}" -v b="${sample[1]:-}" 'BEGIN {
    if (split(a, x, " ") != 4 || split(b, y, " ") != 4 || index(a b, "-")) { print "PCIe not read: " a " / " b; exit }
    steps = (y[1] - x[1]) / 16
    if (steps <= 0) { print "no steps between the two reads"; exit }
    printf "per step %.0f MB to the device, %.0f MB to the host, %.0f MB of tensor bytes sent (%.1f steps read)",
      (y[2] - x[2]) / steps / 1e6, (y[3] - x[3]) / steps / 1e6, (y[4] - x[4]) / steps / 1e6, steps }')"
  pass "$(awk -v s="$sgp_rate" -v n="$none_rate" -v p="$(grep -m 1 -oE ' params=[0-9]+' "$logs/sgp-124m-peer-0.log" | cut -d= -f2)" -v r="$(json_fields peak_rss_bytes "$sgp_json" | paste -sd/ -)" -v l="$(json_field final_eval_loss "$sgp_json")" -v c="$(json_field final_eval_loss "$none_json")" -v q="$pcie" 'BEGIN {
    printf "sgp-124m (%s parameters) steady %.2f samples/s with SGP int8 against %.2f without averaging: a step takes %.2fx the control'"'"'s; eval loss %.4f vs %.4f; peak RSS %s bytes; %s", p, s, n, n / s, l, c, r, q }')"
else
  fail "sgp-124m (exit sgp $sgp_status, none $none_status; $out)"
fi

# --- summary -------------------------------------------------------------------------------------
echo
echo "== gpu-check: $host"
printf '%s\n' "${summary[@]}"
total=${#summary[@]}
echo "RESULT $((total - failed))/$total checks passed in $((SECONDS - started)) s (logs: $logs)"
((failed == 0))
