#!/usr/bin/env bash
# The whole CPU job for one call on a lent GPU host (its CPU is the one to measure): CPU facts,
# the side-by-side record (run.sh), correctness on that CPU (cpu_check), and three tuning
# variants of ours (built from sed-edited copies of the tree) timed at the same shapes.
# Takes about 130 s on the H100 host; results land in $OUT.
# Run as: bash bench/cpu/device_tune.sh 2>&1 | tee $OUT/log.txt
set -u
cd "$(dirname "$0")/../.."
start=$SECONDS
elapsed() { echo "-- $1 at $((SECONDS - start)) s"; }
echo "== machine"
lscpu | grep -E "Model name|^CPU\(s\)|Thread\(s\)|Core\(s\)|L2|MHz"
python3 -c "import torch; print('torch', torch.__version__, torch.get_num_threads(), torch.backends.cpu.get_cpu_capability())"
export OMP_NUM_THREADS=$(nproc)

echo "== build (A: as committed, B: micro-kernel rows 12, C: forward blocks 128 x 64, D: backward key block 128)"
for v in C D; do mkdir -p /tmp/v/$v && cp -r CMakeLists.txt src include bench /tmp/v/$v/; done
sed -i 's/constexpr int kQueryBlock = 64;/constexpr int kQueryBlock = 128;/; s/constexpr int kKeyBlock = 128;/constexpr int kKeyBlock = 64;/' /tmp/v/C/src/cpu/forward.cpp
sed -i 's/constexpr int kKeyBlock = 64;/constexpr int kKeyBlock = 128;/' /tmp/v/D/src/cpu/backward.cpp
build() {  # name source extra-cmake-args...
  cmake -S "$2" -B /tmp/b/$1 -G Ninja -DCMAKE_BUILD_TYPE=Release "${@:3}" >/tmp/b_$1.log 2>&1 &&
    cmake --build /tmp/b/$1 -j 4 >>/tmp/b_$1.log 2>&1 && echo "built $1" || { echo "BUILD $1 FAILED"; tail -20 /tmp/b_$1.log; }
}
build A bench/cpu & a=$!
build B bench/cpu -DCMAKE_CXX_FLAGS=-DFLASHATTN_CPU_MR=12 & b=$!
build C /tmp/v/C/bench/cpu & c=$!
build D /tmp/v/D/bench/cpu & d=$!
wait $a $b $c $d
elapsed built

echo "== side by side (A and PyTorch)"
BUILD_DIR=/tmp/b/A FLASHATTN_COMMIT=${COMMIT:-unknown} timeout 150 bash bench/cpu/run.sh "$OUT"
elapsed record

echo "== correctness on this CPU (A)"
timeout 80 /tmp/b/A/cpu_check 2026 > "$OUT/check.txt" 2>&1; echo "cpu_check rc=$?"
grep -E "FAIL|passed|FAILURES" "$OUT/check.txt"; wc -l < "$OUT/check.txt"
elapsed check

echo "== variants"
for v in B C D; do
  [ $((SECONDS - start)) -gt 350 ] && { echo "skip $v (time)"; continue; }
  timeout 45 /tmp/b/$v/cpu_bench bench/cpu/shapes.txt "$OUT/variant_$v.json" | cut -d, -f2-7,10,12 | sed "s/^/$v /"
done
elapsed done
