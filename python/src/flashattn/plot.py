"""Plots of benchmark results: throughput against sequence length, one line per implementation.

    python -m flashattn.plot RESULTS.json [RESULTS.json ...] [-o OUT.png]

writes RESULTS.png beside each JSON (or OUT.png for a single input). It reads the JSON of

- ``python/benchmarks/side_by_side.py`` (``{"info", "train", "decode"}``),
- ``flashattn bench --json`` (``{"tool": "flashattn bench", "suite", "rows"}``), and
- ``bench/gpu_bench.py`` (``{"info", "rows"}``, each row naming its ``impl``).

Training shapes get one panel per head dim and mask (rows: head dims; columns: no mask, causal)
with TFLOP/s against the sequence length, forward solid and backward dashed; decoding shapes a
panel of K+V read bandwidth (TB/s) against the KV length. A GEMM or copy ceiling the JSON
measured is drawn as a grey dotted line.

Needs matplotlib (pinned in python/requirements-test.txt) and nothing else: this file imports
nothing from flashattn, so bench/plot.py loads it from the source tree for the C++ command line.
"""
import argparse
import json
import math
import os
import sys

__all__ = ["load_series", "plot", "plot_file", "main"]

# Implementations in this order get the first colours; others follow by name.
_ORDER = ["flashattn", "flashattn-auto", "flashattn_bhsd", "flashattn-sm80", "fa2", "cudnn", "mem-eff", "flex"]


def load_series(results):
    """The points of a benchmark's results, in one form.

    Returns (points, meta): points are dicts with kind ("train" or "decode"), impl, d, causal
    (train), x (sequence length: n for training, n_k for decoding), fwd and bwd (TFLOP/s; bwd
    None where not measured) or tb_s (decoding, TB/s); meta holds what names the run (device,
    dtype, date, commit, tool) and ceilings (gemm_tflops, copy_tb_s) where the JSON has them.
    """
    points, info = [], dict(results.get("info") or {})
    if results.get("tool") == "flashattn bench":  # the C++ command line
        info.setdefault("tool", f"flashattn bench --suite {results.get('suite')} ({results.get('backend')})")
        info.setdefault("dtype", results.get("dtype"))
        impl = "flashattn"
        for r in results.get("rows", []):
            points.append(_point(r, impl, decode=results.get("suite") == "decode"))
    elif "train" in results or "decode" in results:  # python/benchmarks/side_by_side.py
        info.setdefault("tool", "side_by_side.py")
        for r in results.get("train", []):
            for impl, value in r.items():
                if isinstance(value, list) and len(value) == 2:
                    points.append({"kind": "train", "impl": impl, "d": r["d"], "causal": bool(r["causal"]),
                                   "x": r["n"], "fwd": value[0], "bwd": value[1]})  # fmt: skip
        for r in results.get("decode", []):
            for impl, value in r.items():
                if impl not in ("n_k", "rounds", "b", "h", "h_kv", "d") and isinstance(value, (int, float)):
                    points.append({"kind": "decode", "impl": impl, "d": r.get("d", 128), "h": r.get("h", 32),
                                   "h_kv": r.get("h_kv", 8), "x": r["n_k"], "tb_s": value})  # fmt: skip
    elif "rows" in results:  # bench/gpu_bench.py
        info.setdefault("tool", "gpu_bench.py")
        for r in results["rows"]:
            if "error" in r or "impl" not in r:
                continue
            points.append(_point(r, r["impl"], decode=r.get("suite") == "decode"))
    else:
        raise ValueError("flashattn.plot: not a benchmark result (expected side_by_side.py's, gpu_bench.py's or "
                         "`flashattn bench --json`'s JSON)")  # fmt: skip
    meta = {k: info.get(k) for k in ("device", "dtype", "date", "commit", "tool", "method")}
    meta["gemm_tflops"] = info.get("gemm_bf16_tflops")
    meta["copy_tb_s"] = info.get("copy_tb_s")
    return points, meta


def _point(r, impl, decode):
    if decode:
        return {"kind": "decode", "impl": impl, "d": r["d"], "h": r.get("h"), "h_kv": r.get("h_kv"),
                "x": r.get("n_k", r.get("n")), "tb_s": r["kv_tb_s"]}  # fmt: skip
    return {"kind": "train", "impl": impl, "d": r["d"], "causal": bool(r.get("causal")), "x": r["n"],
            "fwd": r["fwd_tflops"], "bwd": r.get("bwd_tflops")}  # fmt: skip


def _colours(impls):
    import matplotlib

    known = [i for i in _ORDER if i in impls]
    ordered = known + sorted(set(impls) - set(known))
    cycle = matplotlib.colormaps["tab10"].colors
    return {impl: cycle[i % len(cycle)] for i, impl in enumerate(ordered)}


def _length_axis(ax, xs):
    ax.set_xscale("log", base=2)
    ticks = sorted(set(xs))
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{x // 1024}k" if x >= 1024 and x % 1024 == 0 else str(x) for x in ticks])
    ax.minorticks_off()
    ax.grid(True, which="major", alpha=0.3)
    ax.set_ylim(bottom=0)


def _title(meta):
    parts = [meta.get("device"), meta.get("dtype")]
    date = meta.get("date")
    if date:
        parts.append(str(date)[:10])
    if meta.get("commit"):
        parts.append(f"commit {str(meta['commit'])[:10]}")
    parts.append(meta.get("tool"))
    return " | ".join(str(p) for p in parts if p)


def plot(points, meta, path):
    """Draws `points` (as :func:`load_series` returns them) into a PNG at `path`."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state
    from matplotlib.lines import Line2D

    train = [p for p in points if p["kind"] == "train"]
    decode = [p for p in points if p["kind"] == "decode"]
    if not train and not decode:
        raise ValueError("flashattn.plot: the results hold no measurement to plot")
    dims = sorted({p["d"] for p in train})
    masks = sorted({p["causal"] for p in train})
    decode_shapes = sorted({(p["d"], p.get("h") or 0, p.get("h_kv") or 0) for p in decode})
    cols = max(len(masks), min(len(decode_shapes), 2), 1)
    rows = len(dims) + math.ceil(len(decode_shapes) / cols)
    colours = _colours({p["impl"] for p in points})

    fig = Figure(figsize=(5.2 * cols, 3.6 * rows + 0.8), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)
    has_bwd = False
    for i, d in enumerate(dims):
        for j, causal in enumerate(masks):
            ax = axes[i][j]
            ax.set_visible(True)
            panel = [p for p in train if p["d"] == d and p["causal"] == causal]
            for impl in colours:
                line = sorted((p for p in panel if p["impl"] == impl), key=lambda p: p["x"])
                if not line:
                    continue
                xs = [p["x"] for p in line]
                ax.plot(xs, [p["fwd"] for p in line], "-o", color=colours[impl], markersize=4)
                if any(p.get("bwd") for p in line):
                    has_bwd = True
                    ax.plot(xs, [p.get("bwd") or math.nan for p in line], "--s", color=colours[impl], markersize=3.5)
            if meta.get("gemm_tflops"):
                ax.axhline(meta["gemm_tflops"], color="grey", linestyle=":", linewidth=1)
            _length_axis(ax, [p["x"] for p in panel])
            ax.set_title(f"head dim {d}, {'causal' if causal else 'no mask'}")
            ax.set_xlabel("sequence length")
            ax.set_ylabel("TFLOP/s")
    for k, shape in enumerate(decode_shapes):
        ax = axes[len(dims) + k // cols][k % cols]
        ax.set_visible(True)
        d, h, h_kv = shape
        panel = [p for p in decode if (p["d"], p.get("h") or 0, p.get("h_kv") or 0) == shape]
        for impl in colours:
            line = sorted((p for p in panel if p["impl"] == impl), key=lambda p: p["x"])
            if line:
                ax.plot([p["x"] for p in line], [p["tb_s"] for p in line], "-o", color=colours[impl], markersize=4)
        if meta.get("copy_tb_s"):
            ax.axhline(meta["copy_tb_s"], color="grey", linestyle=":", linewidth=1)
        _length_axis(ax, [p["x"] for p in panel])
        heads = f", {h} q / {h_kv} kv heads" if h and h_kv else ""
        ax.set_title(f"decoding, 1 query, head dim {d}{heads}")
        ax.set_xlabel("KV length")
        ax.set_ylabel("K+V read, TB/s")

    handles = [Line2D([], [], color=c, marker="o", markersize=4, label=impl) for impl, c in colours.items()]
    if train:
        handles.append(Line2D([], [], color="black", linestyle="-", label="forward"))
        if has_bwd:
            handles.append(Line2D([], [], color="black", linestyle="--", label="backward"))
    if meta.get("gemm_tflops") and train:
        handles.append(Line2D([], [], color="grey", linestyle=":", label=f"bf16 GEMM {meta['gemm_tflops']:.0f} TFLOP/s"))
    if meta.get("copy_tb_s") and decode:
        handles.append(Line2D([], [], color="grey", linestyle=":", label=f"copy {meta['copy_tb_s']:.2f} TB/s"))
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 5 if cols < 2 else 7),
               frameon=False)  # fmt: skip
    fig.suptitle(_title(meta), fontsize=10)
    fig.savefig(path, dpi=110)
    return path


def plot_file(json_path, png_path=None):
    """Plots the benchmark JSON at `json_path` into `png_path` (default: beside it, .png);
    returns the PNG's path."""
    with open(json_path) as f:
        results = json.load(f)
    if png_path is None:
        png_path = os.path.splitext(json_path)[0] + ".png"
    points, meta = load_series(results)
    return plot(points, meta, png_path)


def main(argv=None, prog="python -m flashattn.plot"):
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", help="benchmark JSON files")
    ap.add_argument("-o", "--output", help="the PNG to write (one input only; default: the JSON's path, .png)")
    args = ap.parse_args(argv)
    if args.output and len(args.results) > 1:
        ap.error("-o/--output takes one input")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("flashattn.plot: needs matplotlib: pip install matplotlib (python/requirements-test.txt pins it)",
              file=sys.stderr)  # fmt: skip
        return 2
    for path in args.results:
        print(plot_file(path, args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
