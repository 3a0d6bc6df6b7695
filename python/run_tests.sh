#!/usr/bin/env bash
# The Python package's tests, for CI and for a machine without a GPU: a virtual environment in
# build-py/venv (FLASHATTN_PY_VENV overrides), the pinned test requirements, a CPU-only build of
# the package in build-py/cpu (kept, so a rerun recompiles only what changed), then pytest on
# python/tests. The torch tests skip where torch is missing, the CUDA ones where there is no GPU.
# Arguments go to pytest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${FLASHATTN_PY_VENV:-$root/build-py/venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
python=$venv/bin/python
pip() { "$python" -m pip --disable-pip-version-check -q "$@"; }

pip install -r "$root/python/requirements-test.txt"
echo "run_tests: building the package (CPU only)"
pip install --no-build-isolation --no-deps \
  -C build-dir="$root/build-py/cpu" -C cmake.define.FLASHATTN_CUDA=OFF "$root/python"
cd "$root/python"
exec "$python" -m pytest -q tests "$@"
