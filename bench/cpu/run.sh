#!/usr/bin/env bash
# The CPU benchmark, side by side: builds cpu_bench (the library tuned for this CPU with
# -march=native), times ours and PyTorch's CPU attention at the shapes of shapes.txt with the
# same thread count, writes one JSON record and prints the ratio table.
#   bench/cpu/run.sh [results folder]      (default: bench/results)
# OMP_NUM_THREADS sets the threads (default: all cores); BUILD_DIR the build folder.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
results=${1:-$root/bench/results}
build=${BUILD_DIR:-$root/build-bench}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
mkdir -p "$results"

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$here" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$(nproc)" >/dev/null

cpu=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2 | tr -cs 'A-Za-z0-9' '-' | sed 's/^-//; s/-$//')
name="cpu_$(date -u +%Y-%m-%d)_${cpu:-unknown}_${OMP_NUM_THREADS}t"
scratch=$(mktemp -d)
"$build/cpu_bench" "$here/shapes.txt" "$scratch/ours.json"
python3 "$here/bench_torch.py" "$here/shapes.txt" "$scratch/torch.json"
python3 "$here/compare.py" "$scratch/ours.json" "$scratch/torch.json" "$results/$name.json"
echo "wrote $results/$name.json"
