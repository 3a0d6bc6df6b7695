"""A training step of a Llama-style model (GQA, rotary, RMSNorm, SwiGLU) with its attention through
flashattn's flash_attn_func or PyTorch's SDPA (its default choice, and forced to cuDNN), in ONE
process on one GPU.

Each implementation's step (forward, loss, backward, AdamW) is timed with CUDA events, median of
--steps steps after warm-up, in --rounds interleaved rounds (the GPU's clocks drift). The
attention's share of a step is read from torch.profiler: the CUDA time of the attention kernels
(names with flashattn, flash, fmha, sdpa or cudnn) over all kernel time of one profiled step.
Every model starts from the same weights; the first step's losses are compared as a sanity check.

Usage: python train_step.py [--seqlens 2048,8192] [--tokens 8192] [--layers 8] [--json PATH]
"""
import argparse
import contextlib
import datetime
import json
import statistics

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashattn.torch import flash_attn_func


def rotary(x, cos, sin):  # x: (b, n, h, d); rotate-half convention
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Block(nn.Module):
    def __init__(self, hidden, heads, kv_heads, attention):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, hidden // heads
        self.attention = attention
        self.norm1, self.norm2 = nn.RMSNorm(hidden), nn.RMSNorm(hidden)
        self.qkv = nn.Linear(hidden, (heads + 2 * kv_heads) * self.d, bias=False)
        self.out = nn.Linear(hidden, hidden, bias=False)
        ffn = 8 * hidden // 3 // 256 * 256
        self.gate_up = nn.Linear(hidden, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x, cos, sin):
        b, n, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, -1, self.d).split([self.heads, self.kv_heads, self.kv_heads], 2)
        y = self.attention(rotary(q, cos, sin), rotary(k, cos, sin), v)  # (b, n, h, d) in and out
        x = x + self.out(y.reshape(b, n, -1))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Model(nn.Module):
    def __init__(self, layers, hidden, heads, kv_heads, vocab, attention):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads, kv_heads, attention) for _ in range(layers))
        self.norm = nn.RMSNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)
        self.d = hidden // heads

    def forward(self, tokens):
        n = tokens.shape[1]
        inv = 1.0 / (10000 ** (torch.arange(0, self.d, 2, device=tokens.device) / self.d))
        angles = torch.outer(torch.arange(n, device=tokens.device), inv)
        cos = torch.cat((angles, angles), -1).cos()[None, :, None, :].to(torch.bfloat16)
        sin = torch.cat((angles, angles), -1).sin()[None, :, None, :].to(torch.bfloat16)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(self.norm(x))


def ours(q, k, v):
    return flash_attn_func(q, k, v, causal=True)


def sdpa(q, k, v):  # SDPA takes (b, h, n, d)
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                       enable_gqa=True)
    return y.transpose(1, 2)


def make_step(model, tokens, backend):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step():
        with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tokens[:, 1:].reshape(-1))
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss
    return step


def time_steps(step, steps):
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


ATTENTION_KERNELS = ("flashattn", "flash", "fmha", "sdpa", "cudnn")


def attention_share(step):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    total = attention = 0.0
    for e in prof.key_averages():
        t = e.device_time_total
        if t <= 0:
            continue
        total += t
        if any(word in e.key.lower() for word in ATTENTION_KERNELS):
            attention += t
    return attention / total if total else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlens", default="2048,8192")
    ap.add_argument("--tokens", type=int, default=8192, help="tokens per step (batch = tokens / seqlen)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "model": {
                "layers": args.layers, "hidden": args.hidden, "heads": args.heads, "kv_heads": args.kv_heads,
                "head_dim": args.hidden // args.heads, "vocab": args.vocab, "dtype": "bf16"},
            "method": "python/benchmarks/train_step.py: CUDA-event medians of whole training steps "
                      f"(forward, loss, backward, AdamW), median of {args.rounds} interleaved rounds"}
    print(json.dumps(info), flush=True)
    impls = {"flashattn": (ours, None), "sdpa_default": (sdpa, None),
             "sdpa_cudnn": (sdpa, SDPBackend.CUDNN_ATTENTION)}
    rows = []
    for n in (int(x) for x in args.seqlens.split(",")):
        batch = max(args.tokens // n, 1)
        torch.manual_seed(0)
        tokens = torch.randint(0, args.vocab, (batch, n + 1), device="cuda")
        base = Model(args.layers, args.hidden, args.heads, args.kv_heads, args.vocab, ours).cuda().to(torch.bfloat16)
        steps, row = {}, {"seqlen": n, "batch": batch}
        for name, (attention, backend) in impls.items():
            model = Model(args.layers, args.hidden, args.heads, args.kv_heads, args.vocab, attention)
            model.load_state_dict(base.state_dict())
            model = model.cuda().to(torch.bfloat16)
            steps[name] = make_step(model, tokens, backend)
            row[name + "_first_loss"] = float(steps[name]())  # warm-up, and the same loss for all
            steps[name]()
        del base
        samples = {name: [] for name in steps}
        for _ in range(args.rounds):
            for name, step in steps.items():
                samples[name].append(time_steps(step, args.steps))
        for name in steps:
            row[name + "_ms"] = statistics.median(samples[name])
            row[name + "_attention_share"] = attention_share(steps[name])
        row["flashattn_speedup_vs_sdpa_default"] = row["sdpa_default_ms"] / row["flashattn_ms"]
        row["flashattn_speedup_vs_sdpa_cudnn"] = row["sdpa_cudnn_ms"] / row["flashattn_ms"]
        print(json.dumps(row), flush=True)
        rows.append(row)
        del steps
        torch.cuda.empty_cache()
    print("\nseqlen batch | step ms: flashattn / SDPA default / SDPA cuDNN | speed-up | attention share")
    for r in rows:
        print(f"{r['seqlen']:>6} {r['batch']:>5} | {r['flashattn_ms']:.2f} / {r['sdpa_default_ms']:.2f} / "
              f"{r['sdpa_cudnn_ms']:.2f} | {r['flashattn_speedup_vs_sdpa_default']:.3f}, "
              f"{r['flashattn_speedup_vs_sdpa_cudnn']:.3f} | {r['flashattn_attention_share']:.2f} / "
              f"{r['sdpa_default_attention_share']:.2f} / {r['sdpa_cudnn_attention_share']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
