"""flashattn.cmake_prefix_path(): the installed package holds the C++ library's CMake package,
headers and library, and an outside CMake project builds and runs against it."""
import pathlib
import re
import shutil
import subprocess

import pytest

import flashattn

CONSUMER = pathlib.Path(__file__).resolve().parents[2] / "tests" / "consumer"


def run(*args):
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(map(str, args))}:\n{done.stdout}{done.stderr}"
    return done.stdout


def test_prefix_holds_the_cmake_package():
    prefix = pathlib.Path(flashattn.cmake_prefix_path())
    assert prefix.is_dir()
    config = prefix / "lib" / "cmake" / "flashattn" / "flashattnConfig.cmake"
    assert config.is_file()
    assert (config.parent / "flashattnTargets.cmake").is_file()
    assert (prefix / "include" / "flashattn" / "flashattn.hpp").is_file()
    assert list((prefix / "lib").glob("libflashattn.*"))
    # The package's version is the module's.
    version = (config.parent / "flashattnConfigVersion.cmake").read_text()
    assert re.search(r'set\(PACKAGE_VERSION "%s"\)' % re.escape(flashattn.__version__), version)


@pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake on PATH")
@pytest.mark.skipif(not CONSUMER.is_dir(), reason="needs the repository's tests/consumer")
def test_outside_project_builds_against_the_package(tmp_path):
    build = tmp_path / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    run("cmake", "-S", CONSUMER, "-B", build, *generator,
        f"-DCMAKE_PREFIX_PATH={flashattn.cmake_prefix_path()}")
    run("cmake", "--build", build)
    assert "bad shape rejected: yes" in run(build / "flashattn_consumer")
