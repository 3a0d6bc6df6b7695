#!/usr/bin/env python3
"""Side-by-side GPU benchmark: flashattn against PyTorch SDPA's backends, in one run, one device.

Peers (timed here with triton.testing.do_bench, median): SDPA FLASH_ATTENTION (FlashAttention-2
inside PyTorch), CUDNN_ATTENTION, EFFICIENT_ATTENTION, and optionally FlexAttention. Ours: the
`flashattn bench` command (CUDA events, median), run once per kernel family (auto = sm90 on
Hopper where it applies, and sm80 forced), on the same shapes. FLOPs as in the FlashAttention
papers: forward 4*b*h*n*n*d (halved when causal), backward 2.5x forward. Decoding is reported
as bandwidth of reading K and V once, against a measured device-to-device copy.

Writes <out>/gpu_bench.json and prints ratio tables.
"""
import argparse, datetime, json, os, subprocess, sys, tempfile

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

PEERS = {"fa2": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
         "mem-eff": SDPBackend.EFFICIENT_ATTENTION}


def ms(fn):
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def ceilings(dev):
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    gemm = 2 * 8192**3 / ms(lambda: a @ b) / 1e9
    x = torch.empty(2 * 1024**3, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    copy = 2 * x.numel() / ms(lambda: y.copy_(x)) / 1e9
    del a, b, x, y
    torch.cuda.empty_cache()
    return {"gemm_bf16_tflops": gemm, "copy_tb_s": copy}


def train_shapes(quick):
    dims = (128,) if quick else (64, 128, 256)
    lens = (1024, 4096) if quick else (512, 1024, 2048, 4096, 8192, 16384)
    return [(16384 // n, 2048 // d, n, d, c) for d in dims for n in lens for c in (False, True)]


def peer_train(rows, dev, quick, with_flex):
    for b, h, n, d, causal in train_shapes(quick):
        q, k, v = (torch.randn(b, h, n, d, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        do = torch.randn_like(q)
        flops = 4 * b * h * n * n * d / (2 if causal else 1)
        impls = dict(PEERS)
        for name, backend in impls.items():
            r = {"suite": "train", "impl": name, "b": b, "h": h, "n": n, "d": d, "causal": causal}
            try:
                with sdpa_kernel(backend):
                    f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    tf = ms(f)
                    o = f()
                    tb = ms(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
                r.update(fwd_ms=tf, bwd_ms=tb, fwd_tflops=flops / tf / 1e9, bwd_tflops=2.5 * flops / tb / 1e9)
            except Exception as e:  # a backend that does not support the shape
                r["error"] = repr(e)[:160]
            rows.append(r)
            print(json.dumps(r), flush=True)
        if with_flex and (d, n) in ((128, 2048), (128, 8192), (64, 8192)):
            rows.append(flex_row(q, k, v, do, b, h, n, d, causal, flops))
        del q, k, v, do
        torch.cuda.empty_cache()


def flex_row(q, k, v, do, b, h, n, d, causal, flops):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    flex = torch.compile(flex_attention, dynamic=False)
    r = {"suite": "train", "impl": "flex", "b": b, "h": h, "n": n, "d": d, "causal": causal}
    try:
        bm = create_block_mask(lambda b_, h_, qi, ki: qi >= ki, None, None, n, n) if causal else None
        o = flex(q, k, v, block_mask=bm)
        tf = ms(lambda: flex(q, k, v, block_mask=bm))
        tb = ms(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
        r.update(fwd_ms=tf, bwd_ms=tb, fwd_tflops=flops / tf / 1e9, bwd_tflops=2.5 * flops / tb / 1e9)
    except Exception as e:
        r["error"] = repr(e)[:160]
    print(json.dumps(r), flush=True)
    return r


def peer_decode(rows, dev, quick):
    for nk in ((4096,) if quick else (4096, 16384, 65536, 131072)):
        q = torch.randn(8, 32, 1, 128, device=dev, dtype=torch.bfloat16)
        k, v = (torch.randn(8, 8, nk, 128, device=dev, dtype=torch.bfloat16) for _ in range(2))
        kv_bytes = 2 * k.numel() * k.element_size()
        for name in ("fa2", "cudnn"):
            r = {"suite": "decode", "impl": name, "b": 8, "h": 32, "h_kv": 8, "n": 1, "n_k": nk, "d": 128}
            try:
                with sdpa_kernel(PEERS[name]):
                    t = ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
                r.update(fwd_ms=t, kv_tb_s=kv_bytes / t / 1e9)
            except Exception as e:
                r["error"] = repr(e)[:160]
            rows.append(r)
            print(json.dumps(r), flush=True)
        del q, k, v
        torch.cuda.empty_cache()


def ours(rows, binary, family, suite, quick):
    env = dict(os.environ, FLASHATTN_CUDA_FAMILY=family)
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [binary, "bench", "--backend", "cuda", "--dtype", "bf16", "--suite", suite, "--json", f.name]
        if suite == "train":
            cmd.append("--backward")
        if quick:
            cmd.append("--quick")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        print(proc.stdout[-4000:], proc.stderr[-2000:] if proc.returncode else "", flush=True)
        try:
            result = json.load(open(f.name))
        except Exception:
            rows.append({"suite": suite, "impl": f"flashattn-{family}", "error": proc.stderr[-300:]})
            return
    for r in result["rows"]:
        r.update(suite=suite, impl=f"flashattn-{family}")
        rows.append(r)


def find(rows, impl, **key):
    for r in rows:
        if r.get("impl") == impl and all(r.get(k) == v for k, v in key.items()) and "error" not in r:
            return r
    return None


def report(rows, ceil):
    fams = sorted({r["impl"] for r in rows if r["impl"].startswith("flashattn-")})
    print("\nTraining shapes (bf16, 16k tokens, hidden 2048), TFLOP/s fwd / bwd, and ours / peer ratios")
    head = f"{'d':>4} {'n':>6} {'causal':>6} | " + " | ".join(f"{f:>17}" for f in fams) + \
        f" | {'fa2':>13} | {'cudnn':>13} | " + " | ".join(f"{f[10:]}/cudnn fwd,bwd" for f in fams)
    print(head)
    for b, h, n, d, c in train_shapes(False):
        key = dict(suite="train", n=n, d=d, causal=c)
        mine = [find(rows, f, **key) for f in fams]
        fa2, cudnn = find(rows, "fa2", **key), find(rows, "cudnn", **key)
        if not any(mine) and not fa2:
            continue
        cell = lambda r: f"{r['fwd_tflops']:6.0f} / {r.get('bwd_tflops', 0):5.0f}" if r else f"{'-':>13}"
        ratio = lambda r: (f"{r['fwd_tflops'] / cudnn['fwd_tflops']:5.2f}, {r.get('bwd_tflops', 0) / cudnn['bwd_tflops']:4.2f}"
                           if r and cudnn else "-")
        print(f"{d:>4} {n:>6} {str(c):>6} | " + " | ".join(f"{cell(r):>17}" for r in mine) +
              f" | {cell(fa2)} | {cell(cudnn)} | " + " | ".join(f"{ratio(r):>16}" for r in mine))
    print(f"\nDecoding (b=8, 32 q heads / 8 kv heads, d=128, 1 query): K+V read bandwidth, TB/s "
          f"(copy ceiling {ceil['copy_tb_s']:.2f})")
    for nk in (4096, 16384, 65536, 131072):
        key = dict(suite="decode", n_k=nk)
        cells = []
        for impl in fams + ["fa2", "cudnn"]:
            r = find(rows, impl, **key)
            cells.append(f"{impl}={r['kv_tb_s']:.2f}" if r else f"{impl}=-")
        print(f"  KV {nk:>6}: " + "  ".join(cells))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flashattn-bin", required=True)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--flex", action="store_true", help="also time FlexAttention (compiles; slower)")
    ap.add_argument("--families", default="auto,sm80")
    ap.add_argument("--skip-peers", action="store_true")
    args = ap.parse_args()
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)
    info = {"device": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()}
    info.update(ceilings(dev))
    print(info, flush=True)
    rows = []
    os.makedirs(args.out, exist_ok=True)

    def save():  # after every part, so that a run cut short still leaves what it measured
        with open(os.path.join(args.out, "gpu_bench.json"), "w") as f:
            json.dump({"info": info, "rows": rows}, f, indent=1)

    # Peers first: a run cut short then still holds ratios for whatever of ours it reached.
    if not args.skip_peers:
        peer_train(rows, dev, args.quick, args.flex)
        save()
        peer_decode(rows, dev, args.quick)
        save()
    for fam in args.families.split(","):
        ours(rows, args.flashattn_bin, fam, "train", args.quick)
        save()
        ours(rows, args.flashattn_bin, fam, "decode", args.quick)
        save()
    report(rows, info)


if __name__ == "__main__":
    sys.exit(main())
