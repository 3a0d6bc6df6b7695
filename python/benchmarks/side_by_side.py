"""flashattn against PyTorch SDPA's backends in ONE process on one GPU, through the Python package.

A cheaper companion of bench/gpu_bench.py: no C++ build beyond the package's own, every timing
with triton.testing.do_bench (median, L2 flushed), each implementation on its native layout
(ours (b, n, h, d), SDPA (b, h, n, d)). Training shapes as ../shared/ANCHORS.md (16k tokens,
hidden 2048; bf16, or f16 with --dtype f16); FLOPs forward 4*b*h*n*n*d (halved when causal),
backward 2.5x forward.
Decoding: one query, batch 8, 32 query heads over 8 KV heads, d=128, as K+V read bandwidth; ours
also on the peers' (b, h, n, d) memory.
Head dims the package was not built with are skipped.
--plot draws the JSON (TFLOP/s and TB/s against sequence length, one line per implementation, one
panel per head dim and mask) into a PNG beside it, through flashattn.plot (needs matplotlib); a
progress bar (tqdm, where installed) runs on stderr when it is a terminal.

Every shape is timed in --rounds interleaved rounds (ours, FA2, cuDNN, ours, ...), medians
reported: the GPU's clocks drift under its power limit, and single back-to-back timings of
the peers differed by up to 15% between identical runs.

Usage: python side_by_side.py [--dims 64,128] [--dtype bf16|f16] [--rounds 3] [--json PATH [--plot]]
"""
import argparse
import datetime
import json
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from flashattn.torch import flash_attn_func

try:
    from tqdm import tqdm
except ImportError:  # the progress bar is optional
    tqdm = None

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
PEERS = {"fa2": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def ms(fn):
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def interleaved(timers, rounds):
    """Median of `rounds` timings per entry of `timers` (name -> callable returning a tuple of ms),
    taken in rounds that visit every entry once: the GPU's clock and power state drift over
    seconds, and interleaving spreads that drift over all implementations alike."""
    samples = {name: [] for name in timers}
    for _ in range(rounds):
        for name, timer in timers.items():
            samples[name].append(timer())
    return {name: [statistics.median(col) for col in zip(*runs)] for name, runs in samples.items()}


def fwd_bwd_timer(forward, inputs, dout):
    out = forward()

    def timer():
        return ms(forward), ms(lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True))
    return timer


def sdpa_timer(backend, run):
    def timer():
        with sdpa_kernel(backend):
            return run()
    return timer


class Progress:
    """A tqdm bar over the shapes on stderr, with each row's JSON printed above it, where stderr is
    a terminal; elsewhere (a log) or without tqdm, the rows printed as they finish are the progress."""

    def __init__(self, total):
        interactive = tqdm is not None and sys.stderr.isatty()
        self.bar = tqdm(total=total, unit="shape", file=sys.stderr, dynamic_ncols=True) if interactive else None

    def start(self, what):
        if self.bar:
            self.bar.set_description(what)

    def done(self, row):
        if self.bar:
            self.bar.write(json.dumps(row), file=sys.stdout)
            self.bar.update(1)
        else:
            print(json.dumps(row), flush=True)

    def close(self):
        if self.bar:
            self.bar.close()


def train_rows(dims, lens, rounds, dtype, progress):
    dev = "cuda"
    for d in dims:
        h = 2048 // d
        for n in lens:
            b = 16384 // n
            for causal in (False, True):
                progress.start(f"d={d} n={n}{' causal' if causal else ''}")
                flops = 4 * b * h * n * n * d / (2 if causal else 1)
                row = {"d": d, "n": n, "b": b, "h": h, "causal": causal, "rounds": rounds}
                # Ours on (b, n, h, d), SDPA on (b, h, n, d): each on its native layout.
                q, k, v = (torch.randn(b, n, h, d, device=dev, dtype=dtype, requires_grad=True)
                           for _ in range(3))
                do = torch.randn_like(q)
                qt, kt, vt = (torch.randn(b, h, n, d, device=dev, dtype=dtype, requires_grad=True)
                              for _ in range(3))
                dot = torch.randn_like(qt)
                timers = {}
                try:
                    timers["flashattn"] = fwd_bwd_timer(lambda: flash_attn_func(q, k, v, causal=causal), (q, k, v), do)
                except Exception as e:  # head dim not built into the package
                    row["flashattn_error"] = repr(e)[:160]
                for name, backend in PEERS.items():
                    with sdpa_kernel(backend):
                        run = fwd_bwd_timer(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal),
                                            (qt, kt, vt), dot)
                    timers[name] = sdpa_timer(backend, run)
                for name, (tf, tb) in interleaved(timers, rounds).items():
                    row[name] = [flops / tf / 1e9, 2.5 * flops / tb / 1e9]
                del q, k, v, do, qt, kt, vt, dot, timers
                torch.cuda.empty_cache()
                progress.done(row)
                yield row


def decode_rows(lens, rounds, dtype, progress):
    for nk in lens:
        progress.start(f"decode n_k={nk}")
        row = {"n_k": nk, "b": 8, "h": 32, "h_kv": 8, "d": 128, "rounds": rounds}
        q = torch.randn(8, 1, 32, 128, device="cuda", dtype=dtype)
        k, v = (torch.randn(8, nk, 8, 128, device="cuda", dtype=dtype) for _ in range(2))
        kv_bytes = 2 * k.numel() * k.element_size()
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        # Ours also on the peers' memory: SDPA's (b, h, n, d) tensors viewed as (b, n, h, d). There each
        # KV head's cache is one contiguous block; in (b, n, h, d) a key's heads are interleaved.
        kh, vh = (x.transpose(1, 2) for x in (kt, vt))
        timers = {"flashattn": lambda: (ms(lambda: flash_attn_func(q, k, v)),),
                  "flashattn_bhsd": lambda: (ms(lambda: flash_attn_func(q, kh, vh)),)}
        for name, backend in PEERS.items():
            timers[name] = sdpa_timer(
                backend, lambda: (ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)),))
        for name, (t,) in interleaved(timers, rounds).items():
            row[name] = kv_bytes / t / 1e9
        del q, k, v, qt, kt, vt, kh, vh
        torch.cuda.empty_cache()
        progress.done(row)
        yield row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--lens", default="1024,2048,4096,8192,16384")
    ap.add_argument("--decode", default="4096,16384,65536,131072")
    ap.add_argument("--dtype", choices=DTYPES, default="bf16", help="of Q, K, V and the output")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per shape (median)")
    ap.add_argument("--json")
    ap.add_argument("--plot", action="store_true", help="also write the plot beside the JSON (PATH with .png)")
    args = ap.parse_args()
    if args.plot:
        if not args.json:
            ap.error("--plot needs --json PATH (the plot goes beside it)")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            ap.error("--plot needs matplotlib: pip install -r python/requirements-test.txt (or matplotlib)")
    props = torch.cuda.get_device_properties(0)
    info = {"device": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version(), "dtype": args.dtype,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "method": "python/benchmarks/side_by_side.py: do_bench medians in one process, "
                                    f"median of {args.rounds} interleaved rounds"}
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    info["gemm_bf16_tflops"] = 2 * 8192**3 / ms(lambda: a @ a) / 1e9
    del a
    print(json.dumps(info), flush=True)
    dims = [int(x) for x in args.dims.split(",") if x]
    lens = [int(x) for x in args.lens.split(",") if x]
    dtype = DTYPES[args.dtype]
    decode_lens = [int(x) for x in args.decode.split(",") if x]
    progress = Progress(len(dims) * len(lens) * 2 + len(decode_lens))
    train = list(train_rows(dims, lens, args.rounds, dtype, progress))
    decode = list(decode_rows(decode_lens, args.rounds, dtype, progress))
    progress.close()

    print(f"\n{args.dtype}, 16k tokens, hidden 2048: TFLOP/s fwd / bwd, and flashattn / cudnn")
    print(f"{'d':>4} {'n':>6} {'causal':>6} | {'flashattn':>11} | {'fa2':>11} | {'cudnn':>11} | ratio fwd, bwd")
    for r in train:
        if "flashattn" not in r:
            continue
        cell = lambda x: f"{x[0]:4.0f} / {x[1]:4.0f}"
        ratio = f"{r['flashattn'][0] / r['cudnn'][0]:.2f}, {r['flashattn'][1] / r['cudnn'][1]:.2f}"
        print(f"{r['d']:>4} {r['n']:>6} {str(r['causal']):>6} | {cell(r['flashattn'])} | {cell(r['fa2'])} | "
              f"{cell(r['cudnn'])} | {ratio}")
    for r in decode:
        print(f"decode KV {r['n_k']:>6}: TB/s flashattn {r['flashattn']:.2f} (on (b, h, n, d) memory "
              f"{r['flashattn_bhsd']:.2f})  fa2 {r['fa2']:.2f}  cudnn {r['cudnn']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "train": train, "decode": decode}, f, indent=1)
    if args.plot:
        from flashattn.plot import plot_file

        print(f"plot: {plot_file(args.json)}")


if __name__ == "__main__":
    main()
