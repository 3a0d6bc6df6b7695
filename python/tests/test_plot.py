"""flashattn.plot (and bench/plot.py, which `flashattn bench --plot` runs) render PNGs from small
synthetic results in each benchmark's JSON format. Skipped where matplotlib is missing."""
import json
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("matplotlib", reason="needs matplotlib (pinned in python/requirements-test.txt)")

from flashattn import plot  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
LENS = [1024, 2048, 4096]


def side_by_side_results():
    """As python/benchmarks/side_by_side.py writes them."""
    train = [{"d": d, "n": n, "b": 16384 // n, "h": 2048 // d, "causal": causal, "rounds": 3,
              "flashattn": [300.0 + n / 100, 200.0 + d], "fa2": [250.0, 180.0], "cudnn": [320.0, 240.0]}
             for d in (64, 128) for n in LENS for causal in (False, True)]  # fmt: skip
    decode = [{"n_k": nk, "b": 8, "h": 32, "h_kv": 8, "d": 128, "rounds": 3, "flashattn": 2.5, "flashattn_bhsd": 2.6,
               "fa2": 2.4, "cudnn": 2.55} for nk in (4096, 16384)]  # fmt: skip
    info = {"device": "Synthetic GPU", "dtype": "bf16", "date": "2026-11-26T00:00:00+00:00",
            "gemm_bf16_tflops": 790.0}  # fmt: skip
    return {"info": info, "train": train, "decode": decode}


def cli_results(suite):
    """As `flashattn bench --json` writes them (train with --backward, or decode)."""
    if suite == "decode":
        rows = [{"b": 8, "h": 32, "h_kv": 8, "n": 1, "n_k": nk, "d": 128, "causal": False, "fwd_ms": 0.1,
                 "fwd_tflops": 1.0, "kv_tb_s": 2.0 + nk / 1e5, "check_ok": True} for nk in (4096, 16384)]  # fmt: skip
    else:
        rows = [{"b": 16384 // n, "h": 16, "h_kv": 16, "n": n, "n_k": n, "d": 128, "causal": causal, "fwd_ms": 1.0,
                 "fwd_tflops": 400.0 + n / 100, "kv_tb_s": 0.5, "bwd_ms": 2.0, "bwd_tflops": 250.0, "check_ok": True}
                for n in LENS for causal in (False, True)]  # fmt: skip
    return {"tool": "flashattn bench", "suite": suite, "backend": "cuda", "dtype": "bf16", "rows": rows}


def gpu_bench_results():
    """As bench/gpu_bench.py writes them: rows naming their implementation, some failed."""
    rows = [{"suite": "train", "impl": impl, "b": 4, "h": 16, "n": n, "d": 128, "causal": True,
             "fwd_tflops": 300.0, "bwd_tflops": 200.0} for impl in ("fa2", "cudnn") for n in LENS]  # fmt: skip
    rows += [dict(r, impl="flashattn-auto", h_kv=16, n_k=r["n"], kv_tb_s=0.4) for r in rows[:3]]
    rows.append({"suite": "train", "impl": "mem-eff", "error": "RuntimeError('no kernel')"})
    rows += [{"suite": "decode", "impl": impl, "b": 8, "h": 32, "h_kv": 8, "n": 1, "n_k": nk, "d": 128,
              "kv_tb_s": 2.5} for impl in ("fa2", "flashattn-auto") for nk in (4096, 16384)]  # fmt: skip
    info = {"device": "Synthetic GPU", "commit": "0123456789abcdef", "gemm_bf16_tflops": 800.0, "copy_tb_s": 3.0}
    return {"info": info, "rows": rows}


def assert_png(path):
    path = pathlib.Path(path)
    assert path.is_file() and path.stat().st_size > 1000, path
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "name, results",
    [("side_by_side", side_by_side_results()), ("bench_train", cli_results("train")),
     ("bench_decode", cli_results("decode")), ("gpu_bench", gpu_bench_results())],  # fmt: skip
)
def test_plot_file_writes_a_png_beside_the_json(tmp_path, name, results):
    source = tmp_path / f"{name}.json"
    source.write_text(json.dumps(results))
    written = plot.plot_file(str(source))
    assert written == str(tmp_path / f"{name}.png")
    assert_png(written)


def test_series_of_each_format():
    points, meta = plot.load_series(side_by_side_results())
    train = [p for p in points if p["kind"] == "train"]
    assert {p["impl"] for p in train} == {"flashattn", "fa2", "cudnn"}
    assert len(train) == 3 * 2 * len(LENS) * 2 and meta["gemm_tflops"] == 790.0
    assert {p["impl"] for p in points if p["kind"] == "decode"} == {"flashattn", "flashattn_bhsd", "fa2", "cudnn"}
    points, meta = plot.load_series(cli_results("decode"))
    assert [p["x"] for p in points] == [4096, 16384] and all(p["kind"] == "decode" for p in points)
    points, _ = plot.load_series(gpu_bench_results())
    assert "mem-eff" not in {p["impl"] for p in points}  # the failed row is left out
    with pytest.raises(ValueError, match="not a benchmark result"):
        plot.load_series({"something": "else"})


def test_module_command_line(tmp_path):
    source = tmp_path / "results.json"
    source.write_text(json.dumps(side_by_side_results()))
    out = tmp_path / "chosen.png"
    run = subprocess.run([sys.executable, "-m", "flashattn.plot", str(source), "-o", str(out)],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(out)
    assert_png(out)


def test_bench_script_loads_the_module_from_the_source_tree(tmp_path):
    """bench/plot.py, which `flashattn bench --plot` runs, with the package kept off the path."""
    source = tmp_path / "bench.json"
    source.write_text(json.dumps(cli_results("train")))
    # `import flashattn` fails in this process: the script must not need the package.
    code = ("import runpy, sys; sys.modules['flashattn'] = None; sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")  # fmt: skip
    run = subprocess.run([sys.executable, "-c", code, str(ROOT / "bench" / "plot.py"), str(source)],
                         capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert_png(tmp_path / "bench.png")
