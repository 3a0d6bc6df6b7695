"""The GPU targets a Python build compiles when the user names none (cmake/flashattnCudaTargets.cmake).

Runs CMake only, without CUDA: the selection through `cmake -P` on given compute capabilities,
then the whole decision (request, detection, the user's settings winning) in a tiny C++ project.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULE = ROOT / "cmake" / "flashattnCudaTargets.cmake"
CMAKE = shutil.which("cmake")

pytestmark = pytest.mark.skipif(CMAKE is None, reason="needs cmake")


def _select(tmp_path, request):
    script = tmp_path / "select.cmake"
    script.write_text(
        f'include("{MODULE.as_posix()}")\n'
        'flashattn_select_cuda_targets("${REQUEST}" families archs)\n'
        'message("families=${families}|archs=${archs}|ignored=${FLASHATTN_CUDA_TARGETS_IGNORED}")\n'
    )
    run = subprocess.run([CMAKE, f"-DREQUEST={request}", "-P", str(script)],
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(run.stderr)
    match = re.search(r"families=(.*)\|archs=(.*)\|ignored=(.*)", run.stderr)
    return match.group(1), match.group(2), match.group(3)


@pytest.mark.parametrize("request_, families, archs, ignored", [
    # No GPU / every GPU: both families, one sm80 binary per major architecture.
    ("all", "sm80;sm90", "80-real;90-real", ""),
    # A Hopper machine: the sm90 family, and the sm80 family for sm_90 (head dim 32, decoding).
    ("90", "sm80;sm90", "90-real", ""),
    ("90;90;90;90", "sm80;sm90", "90-real", ""),
    # Ampere / Ada: the sm80 family only, for each GPU's own architecture.
    ("86", "sm80", "86-real", ""),
    ("89;80", "sm80", "80-real;89-real", ""),
    ("8.6", "sm80", "86-real", ""),
    ("sm_86;sm_90", "sm80;sm90", "86-real;90-real", ""),
    # GPUs without kernels are left out (and named).
    ("75;86", "sm80", "86-real", "75"),
    ("75", "", "", "75"),
    ("120;90", "sm80;sm90", "90-real", "120"),
])
def test_select(tmp_path, request_, families, archs, ignored):
    assert _select(tmp_path, request_) == (families, archs, ignored)


def test_select_rejects_garbage(tmp_path):
    with pytest.raises(RuntimeError, match="not a compute capability"):
        _select(tmp_path, "ampere")


def _configure(src, build, *defines, env=None):
    run = subprocess.run([CMAKE, "-S", str(src), "-B", str(build), *defines],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    cache = {}
    for line in (build / "CMakeCache.txt").read_text().splitlines():
        m = re.match(r"(FLASHATTN_\w+):\w+=(.*)", line)
        if m:
            cache[m.group(1)] = m.group(2)
    return run.stdout, cache


def _visible_gpus():
    """Compute capabilities nvidia-smi reports, or None where it cannot say."""
    smi = shutil.which("nvidia-smi")
    if smi is None or os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        return None
    run = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                         capture_output=True, text=True)
    if run.returncode != 0:
        return None
    return sorted({line.strip().replace(".", "") for line in run.stdout.splitlines() if line.strip()})


def _project(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.25)\n"
        "project(targets LANGUAGES CXX)\n"
        f'include("{MODULE.as_posix()}")\n'
        "flashattn_default_cuda_targets()\n"
    )
    return src, {k: v for k, v in os.environ.items() if k != "FLASHATTN_CUDA_ARCHS"}


# A stand-in for the driver library: two devices, compute capabilities 8.6 and 9.0.
FAKE_DRIVER = """
extern "C" {
int cuInit(unsigned) { return 0; }
int cuDeviceGetCount(int* n) { *n = 2; return 0; }
int cuDeviceGet(int* d, int i) { *d = i; return 0; }
int cuDeviceGetAttribute(int* v, int attr, int d) {
  *v = attr == 75 ? (d == 0 ? 8 : 9) : attr == 76 ? (d == 0 ? 6 : 0) : -1;
  return *v < 0;
}
}
"""


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
def test_detection_through_the_driver(tmp_path):
    lib = tmp_path / "driver"
    lib.mkdir()
    (lib / "fake.cpp").write_text(FAKE_DRIVER)
    subprocess.run(["c++", "-shared", "-fPIC", "-o", str(lib / "libcuda.so.1"), str(lib / "fake.cpp")],
                   check=True)
    src, env = _project(tmp_path)
    env["LD_LIBRARY_PATH"] = f"{lib}:{env.get('LD_LIBRARY_PATH', '')}"
    out, cache = _configure(src, tmp_path / "build", env=env)
    assert "GPUs of this machine: 86;90" in out, out
    assert cache["FLASHATTN_KERNEL_FAMILIES"] == "sm80;sm90"
    assert cache["FLASHATTN_SM80_ARCHS"] == "86-real;90-real"


def test_default_targets(tmp_path):
    src, env = _project(tmp_path)
    build = tmp_path / "build"

    # Nothing set: the detected GPUs, all where none is visible.
    out, cache = _configure(src, build, env=env)
    assert cache["FLASHATTN_CUDA_ARCHS"] == "auto"
    gpus = _visible_gpus()
    if gpus is None and "no GPU visible" not in out:
        pytest.skip("GPUs detected but nvidia-smi cannot tell which: " + out)
    if not gpus:
        assert "no GPU visible: all" in out, out
        assert cache["FLASHATTN_KERNEL_FAMILIES"] == "sm80;sm90"
        assert cache["FLASHATTN_SM80_ARCHS"] == "80-real;90-real"
    else:
        assert "GPUs of this machine: " in out, out
        with_kernels = [c for c in gpus if 80 <= int(c) < 90 or c == "90"]
        if with_kernels:
            assert cache["FLASHATTN_SM80_ARCHS"] == ";".join(f"{c}-real" for c in with_kernels)

    # An explicit list replaces what was derived; the user's own family setting wins.
    out, cache = _configure(src, build, "-DFLASHATTN_CUDA_ARCHS=86",
                            "-DFLASHATTN_KERNEL_FAMILIES=sm90", env=env)
    assert cache["FLASHATTN_SM80_ARCHS"] == "86-real"
    assert cache["FLASHATTN_KERNEL_FAMILIES"] == "sm90"
    assert "FLASHATTN_KERNEL_FAMILIES=sm90 (set by the user)" in out

    # The environment variable, with the define back at auto; the user's value stays.
    out, cache = _configure(src, build, "-DFLASHATTN_CUDA_ARCHS=auto",
                            env={**env, "FLASHATTN_CUDA_ARCHS": "8.9;9.0"})
    assert "environment FLASHATTN_CUDA_ARCHS=8.9;9.0" in out
    assert cache["FLASHATTN_SM80_ARCHS"] == "89-real;90-real"
    assert cache["FLASHATTN_KERNEL_FAMILIES"] == "sm90"
