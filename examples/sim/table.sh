#!/usr/bin/env bash
# Runs every cell of the training-mode table (table-*.toml) with seeds 1, 2 and 3 and
# prints a markdown table of the median samples/s, and of each median over the same
# algorithm's no-straggler median.
#
#   examples/sim/table.sh                 # builds and runs murmur in release
#   MURMUR=target/release/murmur examples/sim/table.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
murmur=${MURMUR:-}
if [[ -z "$murmur" ]]; then
    cargo build --release -q -p murmur
    murmur=target/release/murmur
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

conditions=(baseline straggler quarter-slow churn)
declare -A median
for algorithm in sgp butterfly ring; do
    for condition in "${conditions[@]}"; do
        file="examples/sim/table-$algorithm-$condition.toml"
        values=()
        for seed in 1 2 3; do
            sed "s/^seed = 1\$/seed = $seed/" "$file" > "$work/cell.toml"
            json=$("$murmur" sim "$work/cell.toml" --json --csv "$work/cell.csv")
            values+=("$(grep -o '"samples_per_sec":[0-9.e+-]*' <<< "$json" | cut -d: -f2)")
        done
        median[$algorithm-$condition]=$(printf '%s\n' "${values[@]}" | sort -g | sed -n 2p)
        echo "$file: seeds 1-3 ${values[*]} -> median ${median[$algorithm-$condition]}" >&2
    done
done

echo "| algorithm | no straggler | one 4x straggler | a quarter 2x slower | churn |"
echo "|---|---|---|---|---|"
for algorithm in sgp butterfly ring; do
    base=${median[$algorithm-baseline]}
    row="| $algorithm"
    for condition in "${conditions[@]}"; do
        value=${median[$algorithm-$condition]}
        row+=$(awk -v v="$value" -v b="$base" 'BEGIN { printf " | %.0f (%.3f)", v, v / b }')
    done
    echo "$row |"
done
