// Ring attention over zigzag shards (include/flashattn/distributed.hpp). The arguments were
// validated by dist.cpp; `z` describes the shards.
//
// Forward: K/V of this rank go into buffer 0; at step i this rank holds the K/V of rank
// r - i, starts sending them on to r + 1 (and receiving r - i - 1's into the other buffer),
// runs its attention calls against them and merges each partial output into a float32
// accumulator through the LSEs. Backward: the same walk; each step's dK/dV go into float32
// accumulators that travel one step behind the K/V and reach their owner after the last step.
#include "dist/ring.hpp"

#include <limits>

#include "dist/ops.hpp"
#include "dist/workspace.hpp"

namespace flashattn::dist::detail {
namespace {

struct KV {
  TensorView k, v;
};

KV kv_buffer(Workspace& ws, DType dtype, const TensorView& k, const TensorView& v) {
  KV b;
  if (k.rank == 4) {
    b.k = ws.tensor(dtype, {k.shape[0], k.shape[1], k.shape[2], k.shape[3]});
    b.v = ws.tensor(dtype, {v.shape[0], v.shape[1], v.shape[2], v.shape[3]});
  } else {
    b.k = ws.tensor(dtype, {k.shape[0], k.shape[1], k.shape[2]});
    b.v = ws.tensor(dtype, {v.shape[0], v.shape[1], v.shape[2]});
  }
  return b;
}

TensorView like(Workspace& ws, DType dtype, const TensorView& t) {
  return t.rank == 4 ? ws.tensor(dtype, {t.shape[0], t.shape[1], t.shape[2], t.shape[3]})
                     : ws.tensor(dtype, {t.shape[0], t.shape[1], t.shape[2]});
}

// The LSE of one query half, padded for the GPU kernels: (batch, heads, c) or (heads, c).
TensorView half_lse(Workspace& ws, const Zigzag& z, const TensorView& q) {
  return z.varlen ? ws.padded_lse({q.shape[1], z.half}) : ws.padded_lse({q.shape[0], q.shape[2], z.half});
}

// The options of one call: the user's, with this work's causality and the halves' offsets.
template <class Args>
void set_work_options(Args& a, const AttentionOptions& user, const Zigzag& z, const RingWork& w) {
  a.softmax_scale = user.softmax_scale;
  a.softcap = user.softcap;
  a.stream = user.stream;
  a.causal = w.causal;
  a.window_left = -1;
  a.window_right = -1;
  if (z.varlen) {
    a.cu_seqlens_q = TensorView::contiguous(z.cu_half, DType::i32, {z.documents + 1}, user.cu_seqlens_q.device,
                                            user.cu_seqlens_q.device_index);
    a.cu_seqlens_k = a.cu_seqlens_q;
    a.max_seqlen_q = z.max_half;
    a.max_seqlen_k = z.max_half;
  }
}

}  // namespace

void ring_forward(const ForwardArgs& args, Communicator& comm, const Zigzag& z) {
  const DeviceOps& ops = ops_for(args.q.device);
  void* stream = args.stream;
  Workspace ws(ops, args.q.device, args.q.device_index, stream);
  const int R = z.size, r = z.rank, next = (r + 1) % R, prev = (r + R - 1) % R;

  KV kv[2] = {kv_buffer(ws, args.k.dtype, args.k, args.v), {}};
  if (R > 1) kv[1] = kv_buffer(ws, args.k.dtype, args.k, args.v);
  ops.copy(kv[0].k, args.k, stream);
  ops.copy(kv[0].v, args.v, stream);

  const TensorView out_acc = like(ws, DType::f32, args.q);
  ops.fill(out_acc, 0.0f, stream);
  TensorView lse_acc[2], lse_step[2], out_step[2];
  for (int h = 0; h < 2; ++h) {
    lse_acc[h] = half_lse(ws, z, args.q);
    ops.fill(lse_acc[h], -std::numeric_limits<float>::infinity(), stream);
    lse_step[h] = half_lse(ws, z, args.q);
    out_step[h] = like(ws, args.q.dtype, z.part(args.q, 0));
  }

  int cur = 0;
  for (int i = 0; i < R; ++i) {
    const int s = (r + R - i) % R;
    const int ticket = i + 1 < R ? comm.start_exchange({bytes_of(kv[cur].k), bytes_of(kv[cur].v)}, next,
                                                       {bytes_of(kv[1 - cur].k), bytes_of(kv[1 - cur].v)}, prev, stream)
                                 : -1;
    RingWork works[4];
    const int n = ring_works(z, r, s, args.causal, works);
    for (int j = 0; j < n; ++j) {
      const RingWork& w = works[j];
      ForwardArgs f;
      set_work_options(f, args, z, w);
      f.sm_margin = ticket >= 0 ? args.sm_margin : 0;  // SMs for the transfer's kernels
      f.q = z.part(args.q, w.qh);
      f.k = z.part(kv[cur].k, w.kp);
      f.v = z.part(kv[cur].v, w.kp);
      f.out = out_step[w.qh];
      f.lse = lse_step[w.qh];
      flashattn::forward(f);
      ops.merge(z.part(out_acc, w.qh), z.lse_rows(lse_acc[w.qh]), out_step[w.qh], z.lse_rows(lse_step[w.qh]), stream);
    }
    if (ticket >= 0) comm.finish_exchange(ticket, stream);
    cur = 1 - cur;
  }

  ops.copy(args.out, out_acc, stream);
  if (args.lse.present())
    for (int h = 0; h < 2; ++h) ops.copy(z.lse_part(args.lse, h), lse_acc[h], stream);
}

void ring_backward(const BackwardArgs& args, Communicator& comm, const Zigzag& z) {
  const DeviceOps& ops = ops_for(args.q.device);
  void* stream = args.stream;
  Workspace ws(ops, args.q.device, args.q.device_index, stream);
  const int R = z.size, r = z.rank, next = (r + 1) % R, prev = (r + R - 1) % R;

  KV kv[2] = {kv_buffer(ws, args.k.dtype, args.k, args.v), {}};
  KV dkv[2] = {kv_buffer(ws, DType::f32, args.k, args.v), {}};
  if (R > 1) {
    kv[1] = kv_buffer(ws, args.k.dtype, args.k, args.v);
    dkv[1] = kv_buffer(ws, DType::f32, args.k, args.v);
  }
  ops.copy(kv[0].k, args.k, stream);
  ops.copy(kv[0].v, args.v, stream);
  ops.fill(dkv[0].k, 0.0f, stream);
  ops.fill(dkv[0].v, 0.0f, stream);

  const TensorView dq_acc = like(ws, DType::f32, args.q);
  ops.fill(dq_acc, 0.0f, stream);
  const TensorView dq_step = like(ws, args.q.dtype, z.part(args.q, 0));
  TensorView lse[2];
  for (int h = 0; h < 2; ++h) {
    lse[h] = half_lse(ws, z, args.q);
    ops.copy(lse[h], z.lse_part(args.lse, h), stream);
  }
  // dK/dV of each call of a step, added once the travelling accumulator has arrived.
  KV dkv_step[4];
  int slots = 0;

  int cur = 0, d = 0, dkv_ticket = -1;
  for (int i = 0; i < R; ++i) {
    const int s = (r + R - i) % R;
    const int kv_ticket = i + 1 < R ? comm.start_exchange({bytes_of(kv[cur].k), bytes_of(kv[cur].v)}, next,
                                                          {bytes_of(kv[1 - cur].k), bytes_of(kv[1 - cur].v)}, prev,
                                                          stream)
                                    : -1;
    RingWork works[4];
    const int n = ring_works(z, r, s, args.causal, works);
    for (int j = 0; j < n; ++j) {
      const RingWork& w = works[j];
      if (j >= slots) dkv_step[slots++] = kv_buffer(ws, args.k.dtype, args.k, args.v);
      BackwardArgs b;
      set_work_options(b, args, z, w);
      b.sm_margin = kv_ticket >= 0 || dkv_ticket >= 0 ? args.sm_margin : 0;  // SMs for the transfers' kernels
      b.deterministic = args.deterministic;
      b.q = z.part(args.q, w.qh);
      b.k = z.part(kv[cur].k, w.kp);
      b.v = z.part(kv[cur].v, w.kp);
      b.out = z.part(args.out, w.qh);
      b.dout = z.part(args.dout, w.qh);
      b.lse = lse[w.qh];
      b.dq = dq_step;
      b.dk = z.part(dkv_step[j].k, w.kp);
      b.dv = z.part(dkv_step[j].v, w.kp);
      flashattn::backward(b);
      ops.add(z.part(dq_acc, w.qh), dq_step, stream);
    }
    if (dkv_ticket >= 0) {
      comm.finish_exchange(dkv_ticket, stream);
      d = 1 - d;
    }
    for (int j = 0; j < n; ++j) {
      ops.add(z.part(dkv[d].k, works[j].kp), z.part(dkv_step[j].k, works[j].kp), stream);
      ops.add(z.part(dkv[d].v, works[j].kp), z.part(dkv_step[j].v, works[j].kp), stream);
    }
    if (kv_ticket >= 0) comm.finish_exchange(kv_ticket, stream);
    // The accumulator of the K/V just used goes on to the next rank (after the last step: to
    // its owner).
    if (R > 1)
      dkv_ticket = comm.start_exchange({bytes_of(dkv[d].k), bytes_of(dkv[d].v)}, next,
                                       {bytes_of(dkv[1 - d].k), bytes_of(dkv[1 - d].v)}, prev, stream);
    cur = 1 - cur;
  }
  if (dkv_ticket >= 0) {
    comm.finish_exchange(dkv_ticket, stream);
    d = 1 - d;
  }
  ops.copy(args.dq, dq_acc, stream);
  ops.copy(args.dk, dkv[d].k, stream);
  ops.copy(args.dv, dkv[d].v, stream);
}

}  // namespace flashattn::dist::detail
