"""The FP8 (e4m3) forward against cuDNN's, in ONE process on one Hopper GPU.

Shapes of the issue's speed target and of ../shared/ANCHORS.md: 16k tokens x hidden 2048 (batch
16384 / n, 2048 / d heads), head dims 128 and 256, causal and not. Both sides take e4m3 Q, K, V
in the (b, n, h, d) layout with one descale factor per tensor:
  ours   flashattn.torch.flash_attn_func on float8_e4m3fn tensors (bf16 output, fp32 LSE kept;
         V's transpose to V^T included: a pre-pass of the call, or in the kernel where few query
         rows read each KV head's V);
  cudnn  cuDNN's sdpa_fp8 through its Python frontend (nvidia-cudnn-frontend, run with 1.32.0:
         `pip install nvidia-cudnn-frontend==1.32.0`; skipped when absent), inference mode (no
         stats), its output e4m3 (cuDNN requires an FP8 output on Hopper), P's scale 256;
  fa3    FlashAttention-3's flash_attn_func (the `flash_attn_interface` module of its hopper/
         build, where importable; skipped when absent), descale factors (batch, heads_kv), bf16
         output.
Each peer's output is compared once per shape with ours (relative RMS difference) so that a
misread layout cannot pass as speed. FLOPs 4*b*h*n*n*d, halved when causal. Every shape is
timed in --rounds interleaved rounds (ours, cudnn, fa3, ours, ...), medians of
triton.testing.do_bench (median of its repetitions, L2 flushed).

Usage: python fp8_peers.py [--dims 128,256] [--seqlens 1024,...,16384] [--rounds 3] [--json PATH]
"""
import argparse
import datetime
import json
import statistics

import torch
from side_by_side import ms  # the same timing

from flashattn.torch import flash_attn_func

try:
    import cudnn
except ImportError:  # the peers are optional
    cudnn = None
try:
    import flash_attn_interface as fa3
except ImportError:
    fa3 = None

TOKENS, HIDDEN = 16384, 2048


def tflops(b, h, n, d, causal, t_ms):
    flops = 4 * b * h * n * n * d / (2 if causal else 1)
    return flops / (t_ms * 1e-3) / 1e12


class CudnnFp8Forward:
    """cuDNN's FP8 SDPA forward on (b, n, h, d) e4m3 tensors, per-tensor scales, e4m3 output."""

    def __init__(self, q, k, v, causal):
        b, n, h, d = q.shape
        shape, stride = (b, h, n, d), (n * h * d, d, h * d, 1)  # (b, h, n, d) dims over (b, n, h, d) memory
        e4m3, fp32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
        self.handle = cudnn.create_handle()
        cudnn.set_stream(handle=self.handle, stream=torch.cuda.current_stream().cuda_stream)
        g = cudnn.pygraph(io_data_type=e4m3, intermediate_data_type=fp32, compute_data_type=fp32, handle=self.handle)
        tq, tk, tv = (g.tensor(name=x, dim=shape, stride=stride, data_type=e4m3) for x in ("q", "k", "v"))
        scalar = dict(dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=fp32)
        names = ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")
        scales = {x: g.tensor(name=x, **scalar) for x in names}
        o, _, amax_s, amax_o = g.sdpa_fp8(q=tq, k=tk, v=tv, **scales, is_inference=True, attn_scale=d ** -0.5,
                                          use_causal_mask=causal, name="sdpa_fp8")
        o.set_output(True).set_dim(shape).set_stride(stride).set_data_type(e4m3)
        for amax in (amax_s, amax_o):
            amax.set_output(True).set_dim((1, 1, 1, 1)).set_stride((1, 1, 1, 1)).set_data_type(fp32)
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        self.graph = g
        self.out = torch.empty_like(q)
        one = lambda x: torch.full((1, 1, 1, 1), x, dtype=torch.float32, device=q.device)  # noqa: E731
        values = {"descale_q": 1.0, "descale_k": 1.0, "descale_v": 1.0, "descale_s": 1 / 256, "scale_s": 256.0,
                  "scale_o": 1.0}  # fmt: skip
        self.pack = {tq: q, tk: k, tv: v, o: self.out, amax_s: one(0), amax_o: one(0)}
        self.pack.update({scales[x]: one(values[x]) for x in names})
        self.workspace = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device=q.device)

    def __call__(self):
        self.graph.execute(self.pack, self.workspace, handle=self.handle)
        return self.out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dims", default="128,256")
    ap.add_argument("--seqlens", default="1024,2048,4096,8192,16384")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.cuda.get_device_properties(0)
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"), "device": dev.name,
            "torch": torch.__version__, "cudnn_backend": cudnn.backend_version() if cudnn else None,
            "fa3": fa3 is not None}  # fmt: skip
    print(meta, flush=True)
    rows = []
    for d in (int(x) for x in args.dims.split(",")):
        for n in (int(x) for x in args.seqlens.split(",")):
            for causal in (False, True):
                b, h = TOKENS // n, HIDDEN // d
                q, k, v = (torch.randn(b, n, h, d, device="cuda").to(torch.float8_e4m3fn) for _ in range(3))
                one = torch.ones(1, dtype=torch.float32, device="cuda")
                timers = {"ours": lambda: flash_attn_func(q, k, v, causal=causal, q_descale=one, k_descale=one,
                                                          v_descale=one)}  # fmt: skip
                row = {"dim": d, "seqlen": n, "batch": b, "heads": h, "causal": causal}
                ref = timers["ours"]().float()
                peers = {}
                if cudnn is not None:
                    peers["cudnn"] = lambda: CudnnFp8Forward(q, k, v, causal)
                if fa3 is not None:
                    per_head = torch.ones(b, h, dtype=torch.float32, device="cuda")
                    def fa3_forward():
                        out = fa3.flash_attn_func(q, k, v, causal=causal, q_descale=per_head, k_descale=per_head,
                                                  v_descale=per_head)
                        return out[0] if isinstance(out, tuple) else out  # (out, lse) in some versions

                    peers["fa3"] = lambda: fa3_forward
                for name, make in peers.items():
                    try:
                        peer = make()
                        diff = (peer().float() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()
                        row[name + "_vs_ours_rel_rms"] = float(diff)
                        timers[name] = peer
                    except Exception as e:  # a shape the peer does not take: say so, time the others
                        row[name + "_error"] = str(e).splitlines()[0][:200]
                samples = {name: [] for name in timers}
                for _ in range(args.rounds):
                    for name, fn in timers.items():
                        samples[name].append(tflops(b, h, n, d, causal, ms(fn)))
                for name, s in samples.items():
                    row[name] = round(statistics.median(s), 1)
                    row[name + "_rounds"] = [round(x, 1) for x in s]
                for name in peers:
                    if name in row:
                        row["ours_over_" + name] = round(row["ours"] / row[name], 3)
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
