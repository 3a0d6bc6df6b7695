"""What dropout costs: forward (and forward + backward) time with dropout_p = P against without,
for flashattn and, beside it in ONE process on one GPU, PyTorch SDPA's FlashAttention-2 backend
with the same dropout. The issue's target: flashattn's forward with dropout at most 1.15x its
forward without, at d = 128, n = 4k (hidden 2048, 16k tokens: b = 4, h = 16), bf16.

Timings are triton.testing.do_bench medians, median of --rounds interleaved rounds. Ratios
(with / without dropout) are the measurement to read; TFLOP/s count 4*b*h*n^2*d (halved when
causal), the backward 2.5x.

Usage: python dropout_cost.py [--p 0.1] [--dims 128] [--lens 4096] [--rounds 3] [--backward] [--json PATH]
"""
import argparse
import datetime
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from flashattn.torch import flash_attn_func


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--p", type=float, default=0.1, help="dropout probability")
    ap.add_argument("--dims", default="128")
    ap.add_argument("--lens", default="4096")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backward", action="store_true", help="also time forward + backward")
    ap.add_argument("--json")
    args = ap.parse_args()
    info = {"device": torch.cuda.get_device_name(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "dropout_p": args.p,
            "method": "python/benchmarks/dropout_cost.py: do_bench medians, median of "
                      f"{args.rounds} interleaved rounds"}
    print(json.dumps(info), flush=True)
    rows = []
    for d in (int(x) for x in args.dims.split(",")):
        for n in (int(x) for x in args.lens.split(",")):
            for causal in (False, True):
                b, h = max(1, 16384 // n), 2048 // d
                flops = 4 * b * h * n * n * d / (2 if causal else 1)
                q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                           for _ in range(3))
                do = torch.randn_like(q)
                qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))

                def ours(p, backward):
                    def run():
                        out = flash_attn_func(q, k, v, dropout_p=p, causal=causal)
                        if backward:
                            torch.autograd.grad(out, (q, k, v), do)
                    return run

                def fa2(p, backward):
                    def run():
                        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                            out = F.scaled_dot_product_attention(qt, kt, vt, dropout_p=p, is_causal=causal)
                            if backward:
                                torch.autograd.grad(out, (qt, kt, vt), do.transpose(1, 2))
                    return run

                timers = {}
                for name, make in (("ours", ours), ("fa2", fa2)):
                    for p in (0.0, args.p):
                        timers[(name, p, False)] = make(p, False)
                        if args.backward:
                            timers[(name, p, True)] = make(p, True)
                samples = {key: [] for key in timers}
                for _ in range(args.rounds):
                    for key, fn in timers.items():
                        with torch.no_grad() if not key[2] else torch.enable_grad():
                            samples[key].append(do_bench(fn, warmup=25, rep=100, return_mode="median"))
                ms = {key: statistics.median(v) for key, v in samples.items()}
                row = {"d": d, "n": n, "b": b, "h": h, "causal": causal}
                for name in ("ours", "fa2"):
                    row[f"{name}_fwd_ms"] = ms[(name, 0.0, False)]
                    row[f"{name}_fwd_dropout_ms"] = ms[(name, args.p, False)]
                    row[f"{name}_fwd_ratio"] = ms[(name, args.p, False)] / ms[(name, 0.0, False)]
                    row[f"{name}_fwd_dropout_tflops"] = flops / ms[(name, args.p, False)] / 1e9
                    if args.backward:
                        row[f"{name}_fwdbwd_ratio"] = ms[(name, args.p, True)] / ms[(name, 0.0, True)]
                        row[f"{name}_fwdbwd_dropout_tflops"] = 3.5 * flops / ms[(name, args.p, True)] / 1e9
                print(json.dumps(row), flush=True)
                rows.append(row)
                del q, k, v, do, qt, kt, vt
                torch.cuda.empty_cache()
    print(f"\ndropout_p = {args.p}; forward time with / without dropout (target for ours: <= 1.15 at d = 128, n = 4k)")
    print("   d      n causal | ours: ms without / with  ratio  TFLOP/s | SDPA FA2: ms without / with  ratio  TFLOP/s" +
          (" | fwd+bwd ratio ours / FA2" if args.backward else ""))
    for r in rows:
        line = (f"{r['d']:>4} {r['n']:>6} {str(r['causal']):>6} | {r['ours_fwd_ms']:13.3f} / {r['ours_fwd_dropout_ms']:.3f} "
                f"{r['ours_fwd_ratio']:6.3f} {r['ours_fwd_dropout_tflops']:8.0f} | {r['fa2_fwd_ms']:17.3f} / "
                f"{r['fa2_fwd_dropout_ms']:.3f} {r['fa2_fwd_ratio']:6.3f} {r['fa2_fwd_dropout_tflops']:8.0f}")
        if args.backward:
            line += f" | {r['ours_fwdbwd_ratio']:.3f} / {r['fa2_fwdbwd_ratio']:.3f}"
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
