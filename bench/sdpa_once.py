#!/usr/bin/env python3
"""One PyTorch SDPA call (and its backward) on random bf16 inputs, for a profiler to watch.

Usage: sdpa_once.py BACKEND B H H_KV N_Q N_K D BACKWARD
  BACKEND: a torch.nn.attention.SDPBackend name (FLASH_ATTENTION, CUDNN_ATTENTION, ...)
  BACKWARD: 1 to run the backward too.
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

backend = sys.argv[1]
b, h, hkv, nq, nk, d, bwd = map(int, sys.argv[2:9])
q = torch.randn(b, h, nq, d, device="cuda", dtype=torch.bfloat16, requires_grad=bool(bwd))
k, v = (torch.randn(b, hkv, nk, d, device="cuda", dtype=torch.bfloat16, requires_grad=bool(bwd)) for _ in range(2))
with sdpa_kernel(getattr(SDPBackend, backend)):
    o = F.scaled_dot_product_attention(q, k, v, enable_gqa=hkv != h)
    if bwd:
        o.backward(torch.randn_like(o))
torch.cuda.synchronize()
