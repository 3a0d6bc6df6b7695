#pragma once
// Quantizing attention inputs to e4m3 for the FP8 forward (flashattn/attention.hpp: ForwardArgs
// with e4m3 q, k, v and their descale factors).
//
// x (batch, seqlen, heads, head_dim), f32, f16 or bf16, any strides with a contiguous last
// dimension, becomes out (same shape, e4m3) and descale (float32): out * descale stands for x.
// One factor per (sequence, KV head), (batch, heads_kv), amax / 448 over the heads of the group
// (pass the K/V heads for q); with per_block, one per (sequence, KV head, block of
// kFp8ScaleBlockRows rows), (batch, heads_kv, ceil(seqlen / kFp8ScaleBlockRows)): block
// quantization, for q and k (ForwardArgs); or one for the whole tensor, (1,), with per_tensor.
// descale's last dimension is contiguous, the others may have any strides. With `signs` (float32 (head_dim,), entries +-1, head_dim a power of two), x is first
// multiplied by H diag(signs) / sqrt(head_dim), H the Walsh-Hadamard matrix: incoherent
// processing, which leaves QK^T unchanged when Q and K get the same signs and spreads outliers
// over the head dim (docs/kernels/fp8-forward.md measures what it does to the error).
//
// CPU and CUDA tensors (the CUDA kernels: head dims up to 256); both give the same bits. On CUDA
// it runs on `stream` without synchronizing: two passes over x (the maxima, then the values).
#include "flashattn/attention.hpp"
#include "flashattn/tensor.hpp"

namespace flashattn {

struct QuantizeArgs {
  TensorView x;        // (batch, seqlen, heads, head_dim)
  TensorView out;      // e4m3, x's shape
  TensorView descale;  // float32: (batch, heads_kv); (batch, heads_kv, blocks) with per_block; (1,) with per_tensor
  TensorView signs;    // optional: float32 (head_dim,) of +-1
  int heads_kv = 0;    // 0: every head its own factor (heads_kv = heads)
  bool per_tensor = false;
  bool per_block = false;
  void* stream = nullptr;  // cudaStream_t for CUDA tensors
};

void quantize_e4m3(const QuantizeArgs& args);

}  // namespace flashattn
