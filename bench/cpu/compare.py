"""Joins cpu_bench's and bench_torch.py's JSON into one record (device, date, commit, both
sides' rows) and prints the ratio table, ours / PyTorch (> 1: we are faster).

Usage: compare.py ours.json torch.json record.json
"""
import json
import os
import platform
import subprocess
import sys
import time


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def cpu_flags():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                return [f for f in flags if f.startswith(("avx512f", "avx512_bf16", "amx", "avx2", "fma"))]
    except OSError:
        pass
    return []


def commit():
    """FLASHATTN_COMMIT if set (a copy of the tree without .git), else git's HEAD."""
    if os.environ.get("FLASHATTN_COMMIT"):
        return os.environ["FLASHATTN_COMMIT"]
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=here)
        return head.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def key(row):
    return (row["dtype"], row["b"], row["h"], row["n"], row["d"], row["causal"])


def main():
    ours = json.load(open(sys.argv[1]))
    peer = json.load(open(sys.argv[2]))
    peer_rows = {key(r): r for r in peer["rows"] if r.get("impl") == "torch" and "fwd_ms" in r}
    record = {"what": "CPU attention, flashattn CPU backend vs PyTorch F.scaled_dot_product_attention",
              "date": time.strftime("%Y-%m-%d", time.gmtime()), "commit": commit(), "cpu": cpu_model(),
              "cpu_flags": cpu_flags(), "threads": ours[0]["threads"] if ours else None, "torch": peer.get("torch"),
              "flops": "forward 4*b*h*n*n*d (halved when causal), backward 2.5x forward",
              "rows": ours + peer["rows"]}
    json.dump(record, open(sys.argv[3], "w"), indent=1)

    print(f"{record['cpu']}, {record['threads']} threads, torch {record['torch']}, commit {record['commit']}")
    print(f"{'dtype':5} {'b':>2} {'h':>3} {'n':>5} {'d':>4} {'causal':6} | {'fwd GF/s ours':>13} {'torch':>7} "
          f"{'ratio':>6} | {'bwd GF/s ours':>13} {'torch':>7} {'ratio':>6}")
    for row in ours:
        p = peer_rows.get(key(row))
        if not p:
            continue
        print(f"{row['dtype']:5} {row['b']:>2} {row['h']:>3} {row['n']:>5} {row['d']:>4} {str(row['causal']):6} | "
              f"{row['fwd_gflops']:>13.1f} {p['fwd_gflops']:>7.1f} {row['fwd_gflops'] / p['fwd_gflops']:>6.2f} | "
              f"{row['bwd_gflops']:>13.1f} {p['bwd_gflops']:>7.1f} {row['bwd_gflops'] / p['bwd_gflops']:>6.2f}")
    for r in peer["rows"]:
        if r.get("kind") == "fp32_accuracy":
            print(f"torch fp32 accuracy, magnitude {r['magnitude']}, causal {r['causal']}: out {r['out']:.2e} "
                  f"dq {r['dq']:.2e} dk {r['dk']:.2e} dv {r['dv']:.2e}")


if __name__ == "__main__":
    main()
