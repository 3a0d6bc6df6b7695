#!/usr/bin/env python3
"""Plots benchmark JSON (side_by_side.py, gpu_bench.py, `flashattn bench --json`) into PNGs beside
it, with python/src/flashattn/plot.py of this source tree, loaded on its own: the Python package
need not be built or installed, only matplotlib (`flashattn bench --plot` runs this).

Usage: python3 bench/plot.py RESULTS.json [RESULTS.json ...] [-o OUT.png]
(the same as `python -m flashattn.plot` where the package is installed)
"""
import importlib.util
import pathlib
import sys

source = pathlib.Path(__file__).resolve().parents[1] / "python" / "src" / "flashattn" / "plot.py"
spec = importlib.util.spec_from_file_location("flashattn_plot", source)
plot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot)

if __name__ == "__main__":
    sys.exit(plot.main(prog="bench/plot.py"))
