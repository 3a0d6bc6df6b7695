#!/usr/bin/env bash
# The Python package on a GPU machine whose python3 has torch, nanobind and scikit-build-core:
# installs flashattn with the CUDA backend, runs the whole pytest suite (NumPy, torch on CPU and
# CUDA tensors, torch.compile) and the per-call overhead benchmark. Arguments go to pytest.
#
# Settings (environment):
#   FLASHATTN_PY_WHEEL      install this wheel (built for this Python) instead of building
#   FLASHATTN_PY_CUDA       ON (default) or OFF: build with or without the CUDA backend
#   FLASHATTN_PY_FAMILIES   kernel families to build (default "sm80;sm90")
#   FLASHATTN_PY_DTYPES     (default "bf16;f16;e4m3") FLASHATTN_PY_HEADDIMS  (default "64;128")
#   FLASHATTN_PY_BUILD_TIMEOUT  seconds the build may take (default: no limit)
# Kernels are built for the H100/H200 (sm_90) only. Logs, the pytest report and the benchmark's
# JSON go to $OUT (default build-py/gpu).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/build-py/gpu}
mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1

if [ -n "${FLASHATTN_PY_WHEEL:-}" ]; then
  python3 -m pip install -q --no-deps --no-index --force-reinstall "$FLASHATTN_PY_WHEEL" || exit 1
else
  cuda=${FLASHATTN_PY_CUDA:-ON}
  echo "run_gpu_tests: building the package (CUDA backend $cuda)"
  timeout "${FLASHATTN_PY_BUILD_TIMEOUT:-0}" python3 -m pip install --no-build-isolation --no-deps \
    -C build-dir="$root/build-py/gpu-build-$cuda" \
    -C cmake.define.FLASHATTN_CUDA="$cuda" -C cmake.define.FLASHATTN_NATIVE=OFF \
    -C cmake.define.FLASHATTN_KERNEL_FAMILIES="${FLASHATTN_PY_FAMILIES:-sm80;sm90}" \
    -C cmake.define.FLASHATTN_DTYPES="${FLASHATTN_PY_DTYPES:-bf16;f16;e4m3}" \
    -C cmake.define.FLASHATTN_HEADDIMS="${FLASHATTN_PY_HEADDIMS:-64;128}" \
    -C cmake.define.FLASHATTN_SM80_ARCHS=90-real "$root/python" >"$out/build-$cuda.log" 2>&1
  status=$?
  tail -n 25 "$out/build-$cuda.log"
  [ "$status" = 0 ] || { echo "run_gpu_tests: build failed ($status)"; exit 1; }
fi
python3 -c "import torch, flashattn; print('flashattn', flashattn.__version__, '| CUDA build', \
flashattn.built_with_cuda(), '| CUDA available', flashattn.cuda_available(), '| torch', torch.__version__, \
'|', torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"

cd "$root/python"
python3 -m pytest -q -rs -p no:cacheprovider --junitxml="$out/pytest.xml" tests "$@" 2>&1 | tee "$out/pytest.log"
status=${PIPESTATUS[0]}
python3 benchmarks/overhead.py --json "$out/overhead.json" 2>&1 | tee "$out/overhead.log"
exit "$status"
