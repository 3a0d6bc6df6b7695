#!/usr/bin/env bash
# Nsight Compute reports of the kernels we are tuning and of the peers' kernels on the same
# shapes, on a GPU machine. Usage: bench/ncu_profile.sh BIN_DIR OUT_DIR [TARGET ...]
#   BIN_DIR: a build's folder (tools/flashattn inside); OUT_DIR: where reports and text go.
#   Targets (default: all but the *-kernels ones): bwd-d128 bwd-d64 bwd-d256 fa2-bwd-d128
#   fa2-bwd-d64 fa2-bwd-d256 decode-4k fa2-decode-4k; cudnn-decode-4k (cuDNN's split kernel; not in
#   the default set); fwd-d128 and fwd-d128-1k (the forward at
#   n = 8k and at n = 1k, where tile boundaries weigh most; the sm90 kernel on Hopper; not in
#   the default set); bwd-d128-kernels fa2-bwd-d128-kernels (the
#   duration of every kernel of one backward, ours and PyTorch FA2's: the share of the passes
#   around the main kernel); decode-4k-kernels fa2-decode-4k-kernels cudnn-decode-4k-kernels
#   (the same for one decoding call: split kernel and combine).
# Each full target writes <target>.ncu-rep, <target>.txt (details page) and <target>.sass.csv
# (SASS with per-instruction stall samples). The clocks are left as found (--clock-control none).
set -uo pipefail
bin=$1
out=$2
shift 2
targets=${*:-bwd-d128 bwd-d64 bwd-d256 fa2-bwd-d128 fa2-bwd-d64 fa2-bwd-d256 decode-4k fa2-decode-4k}
mkdir -p "$out"
cli=$bin/tools/flashattn

profile() {  # profile NAME KERNEL_REGEX SKIP COMMAND...
  local name=$1 kernel=$2 skip=$3
  shift 3
  ncu --clock-control none --set full --import-source yes -k "regex:$kernel" -s "$skip" -c 1 \
    -f -o "$out/$name" "$@" >"$out/$name.log" 2>&1 || { echo "ncu $name failed"; tail -5 "$out/$name.log"; return; }
  ncu --import "$out/$name.ncu-rep" --page details >"$out/$name.txt" 2>&1
  ncu --import "$out/$name.ncu-rep" --page source --csv --print-source sass >"$out/$name.sass.csv" 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible" \
    "$out/$name.txt" | sed "s/^/$name: /"
}

durations() {  # durations NAME KERNEL_REGEX SKIP COUNT COMMAND...
  local name=$1 kernel=$2 skip=$3 count=$4
  shift 4
  ncu --clock-control none --metrics gpu__time_duration.sum -k "regex:$kernel" -s "$skip" -c "$count" \
    --csv "$@" >"$out/$name.csv" 2>"$out/$name.log" || { echo "ncu $name failed"; tail -5 "$out/$name.log"; return; }
  python3 - "$out/$name.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10 and r[-3] == "gpu__time_duration.sum"]
for r in rows:
    print(f"{r[-1]:>12} {r[-2]:>6}  {r[4][:110]}")
PY
}

sdpa=(python3 "$(dirname "$0")/sdpa_once.py")  # + BACKEND B H HKV NQ NK D BACKWARD

for t in $targets; do
  case $t in
    bwd-d128) profile "$t" backward_dkdv 0 "$cli" run --backend cuda --batch 2 --heads 16 --seqlen 8192 --headdim 128 --backward --check-rows 1 --seed 1 ;;
    bwd-d64) profile "$t" backward_dkdv 0 "$cli" run --backend cuda --batch 2 --heads 32 --seqlen 8192 --headdim 64 --backward --check-rows 1 --seed 1 ;;
    bwd-d256) profile "$t" backward_dkdv 0 "$cli" run --backend cuda --batch 2 --heads 8 --seqlen 8192 --headdim 256 --backward --check-rows 1 --seed 1 ;;
    fa2-bwd-d128) profile "$t" "flash_bwd_dq_dk_dv" 0 "${sdpa[@]}" FLASH_ATTENTION 2 16 16 8192 8192 128 1 ;;
    fa2-bwd-d64) profile "$t" "flash_bwd_dq_dk_dv" 0 "${sdpa[@]}" FLASH_ATTENTION 2 32 32 8192 8192 64 1 ;;
    fa2-bwd-d256) profile "$t" "flash_bwd_dq_dk_dv" 0 "${sdpa[@]}" FLASH_ATTENTION 2 8 8 8192 8192 256 1 ;;
    fwd-d128) profile "$t" forward_kernel 0 "$cli" run --backend cuda --batch 2 --heads 16 --seqlen 8192 --headdim 128 --check-rows 1 --seed 1 ;;
    fwd-d128-1k) profile "$t" forward_kernel 0 "$cli" run --backend cuda --batch 16 --heads 16 --seqlen 1024 --headdim 128 --check-rows 1 --seed 1 ;;
    decode-4k) profile "$t" forward_kernel 0 "$cli" run --backend cuda --batch 8 --heads 32 --heads-kv 8 --seqlen 1 --seqlen-k 4096 --headdim 128 --check-rows 1 --seed 1 ;;
    fa2-decode-4k) profile "$t" "flash_fwd_splitkv_kernel" 0 "${sdpa[@]}" FLASH_ATTENTION 8 32 8 1 4096 128 0 ;;
    cudnn-decode-4k) profile "$t" "flash_fprop" 0 "${sdpa[@]}" CUDNN_ATTENTION 8 32 8 1 4096 128 0 ;;
    bwd-d128-kernels) durations "$t" "backward|convert|reduce" 0 6 "$cli" run --backend cuda --batch 2 --heads 16 --seqlen 8192 --headdim 128 --backward --check-rows 1 --seed 1 ;;
    fa2-bwd-d128-kernels) durations "$t" "." 0 40 "${sdpa[@]}" FLASH_ATTENTION 2 16 16 8192 8192 128 1 ;;
    decode-4k-kernels) durations "$t" "forward|combine" 0 4 "$cli" run --backend cuda --batch 8 --heads 32 --heads-kv 8 --seqlen 1 --seqlen-k 4096 --headdim 128 --check-rows 1 --seed 1 ;;
    fa2-decode-4k-kernels) durations "$t" "." 0 40 "${sdpa[@]}" FLASH_ATTENTION 8 32 8 1 4096 128 0 ;;
    cudnn-decode-4k-kernels) durations "$t" "." 0 40 "${sdpa[@]}" CUDNN_ATTENTION 8 32 8 1 4096 128 0 ;;
    *) echo "unknown target $t" ;;
  esac
done
