// Head-parallel attention (DeepSpeed-Ulysses) over zigzag shards: an all-to-all gives every rank
// the whole sequence for size-th of the heads, the single-device attention runs on it, and an
// all-to-all brings the results back to the sequence shards. Fixed-length batches only (dist.cpp
// rejects cu_seqlens for this strategy).
//
// Heads: rank j takes query heads [j * hq, (j + 1) * hq), hq = heads_q / size, and the K/V heads
// those read under GQA: [j * hq / g, ...) with g = heads_q / heads_kv, hq / g of them, or the one
// K/V head when hq < g (heads_kv < size: that head is then sent to g / hq ranks, and their dK/dV
// are summed on the way back).
#include <limits>
#include <vector>

#include "dist/ops.hpp"
#include "dist/ring.hpp"
#include "dist/workspace.hpp"

namespace flashattn::dist::detail {
namespace {

struct Heads {
  int hq, hk, g;
  int q_begin(int j) const { return j * hq; }
  int kv_begin(int j) const { return j * hq / g; }
};

Heads heads_of(const TensorView& q, const TensorView& k, int R) {
  Heads h;
  h.hq = int(q.shape[2]) / R;
  h.g = int(q.shape[2] / k.shape[2]);
  h.hk = h.hq >= h.g ? h.hq / h.g : 1;
  return h;
}

// Every rank's part of a sequence-sharded tensor (batch, 2c, heads, d) or LSE (batch, heads, 2c):
// heads [begin(j), begin(j) + count) for rank j, sent; the full sequence of this rank's heads
// assembled from what arrives. `seq`/`head` are the dimensions.
template <class Begin>
TensorView gather(Workspace& ws, const DeviceOps& ops, Communicator& comm, const Zigzag& z, const TensorView& local,
                  int seq, int head, int count, Begin begin, void* stream) {
  const int R = z.size;
  auto shape = [&](std::int64_t seqlen) {
    TensorView t = local;
    t.shape[seq] = seqlen;
    t.shape[head] = count;
    return ws.tensor(local.dtype, {t.shape[0], t.shape[1], t.shape[2], t.shape[3]});
  };
  auto shape3 = [&](std::int64_t seqlen) {
    TensorView t = local;
    t.shape[seq] = seqlen;
    t.shape[head] = count;
    return ws.tensor(local.dtype, {t.shape[0], t.shape[1], t.shape[2]});
  };
  auto make = [&](std::int64_t seqlen) { return local.rank == 4 ? shape(seqlen) : shape3(seqlen); };
  std::vector<TensorView> send(R), recv(R);
  std::vector<Buffer> sb(R), rb(R);
  for (int j = 0; j < R; ++j) {
    send[j] = make(local.shape[seq]);
    recv[j] = make(local.shape[seq]);
    ops.copy(send[j], slice(local, head, begin(j), count), stream);
    sb[j] = bytes_of(send[j]);
    rb[j] = bytes_of(recv[j]);
  }
  comm.all_to_all(sb, rb, stream);
  const TensorView full = make(local.shape[seq] * R);
  for (int i = 0; i < R; ++i)
    for (int h = 0; h < 2; ++h)
      ops.copy(slice(full, seq, z.chunk_of(i, h) * z.half, z.half), slice(recv[i], seq, h * z.half, z.half), stream);
  return full;
}

// The reverse: `full` (this rank's heads, whole sequence) cut into every rank's sequence chunks
// and sent back; what arrives from rank j is written into heads [begin(j), +count) of `local`
// (or added, when `accumulate`: then `local` is float32 and zeroed by the caller).
template <class Begin>
void scatter(Workspace& ws, const DeviceOps& ops, Communicator& comm, const Zigzag& z, const TensorView& full,
             const TensorView& local, int seq, int head, int count, Begin begin, bool accumulate, void* stream) {
  const int R = z.size;
  auto make = [&]() {
    TensorView t = full;
    t.shape[seq] = 2 * z.half;
    return t.rank == 4 ? ws.tensor(full.dtype, {t.shape[0], t.shape[1], t.shape[2], t.shape[3]})
                       : ws.tensor(full.dtype, {t.shape[0], t.shape[1], t.shape[2]});
  };
  std::vector<TensorView> send(R), recv(R);
  std::vector<Buffer> sb(R), rb(R);
  for (int i = 0; i < R; ++i) {
    send[i] = make();
    recv[i] = make();
    for (int h = 0; h < 2; ++h)
      ops.copy(slice(send[i], seq, h * z.half, z.half), slice(full, seq, z.chunk_of(i, h) * z.half, z.half), stream);
    sb[i] = bytes_of(send[i]);
    rb[i] = bytes_of(recv[i]);
  }
  comm.all_to_all(sb, rb, stream);
  for (int j = 0; j < R; ++j) {
    const TensorView dst = slice(local, head, begin(j), count);
    if (accumulate)
      ops.add(dst, dst, recv[j], stream);
    else
      ops.copy(dst, recv[j], stream);
  }
}

template <class Args>
void set_options(Args& a, const AttentionOptions& user) {
  a.softmax_scale = user.softmax_scale;
  a.softcap = user.softcap;
  a.stream = user.stream;
  a.causal = user.causal;
}

// The LSE of this rank's heads over the whole sequence, padded for the GPU kernels.
TensorView full_lse(Workspace& ws, const TensorView& q, int hq, int R) {
  return ws.padded_lse({q.shape[0], hq, q.shape[1] * R});
}

}  // namespace

void all_to_all_forward(const ForwardArgs& args, Communicator& comm, const Zigzag& z) {
  const DeviceOps& ops = ops_for(args.q.device);
  void* stream = args.stream;
  Workspace ws(ops, args.q.device, args.q.device_index, stream);
  const Heads hd = heads_of(args.q, args.k, z.size);
  auto qb = [&](int j) { return hd.q_begin(j); };
  auto kb = [&](int j) { return hd.kv_begin(j); };

  ForwardArgs f;
  set_options(f, args);
  f.q = gather(ws, ops, comm, z, args.q, 1, 2, hd.hq, qb, stream);
  f.k = gather(ws, ops, comm, z, args.k, 1, 2, hd.hk, kb, stream);
  f.v = gather(ws, ops, comm, z, args.v, 1, 2, hd.hk, kb, stream);
  f.out = ws.tensor(args.q.dtype, {f.q.shape[0], f.q.shape[1], f.q.shape[2], f.q.shape[3]});
  f.lse = full_lse(ws, args.q, hd.hq, z.size);
  flashattn::forward(f);
  scatter(ws, ops, comm, z, f.out, args.out, 1, 2, hd.hq, qb, false, stream);
  if (args.lse.present()) {
    // Through a contiguous copy: the padded rows are not one buffer.
    const TensorView lse = ws.tensor(DType::f32, {f.lse.shape[0], f.lse.shape[1], f.lse.shape[2]});
    ops.copy(lse, f.lse, stream);
    scatter(ws, ops, comm, z, lse, args.lse, 2, 1, hd.hq, qb, false, stream);
  }
}

void all_to_all_backward(const BackwardArgs& args, Communicator& comm, const Zigzag& z) {
  const DeviceOps& ops = ops_for(args.q.device);
  void* stream = args.stream;
  Workspace ws(ops, args.q.device, args.q.device_index, stream);
  const Heads hd = heads_of(args.q, args.k, z.size);
  auto qb = [&](int j) { return hd.q_begin(j); };
  auto kb = [&](int j) { return hd.kv_begin(j); };

  BackwardArgs b;
  set_options(b, args);
  b.deterministic = args.deterministic;
  b.q = gather(ws, ops, comm, z, args.q, 1, 2, hd.hq, qb, stream);
  b.k = gather(ws, ops, comm, z, args.k, 1, 2, hd.hk, kb, stream);
  b.v = gather(ws, ops, comm, z, args.v, 1, 2, hd.hk, kb, stream);
  b.out = gather(ws, ops, comm, z, args.out, 1, 2, hd.hq, qb, stream);
  b.dout = gather(ws, ops, comm, z, args.dout, 1, 2, hd.hq, qb, stream);
  const TensorView lse = gather(ws, ops, comm, z, args.lse, 2, 1, hd.hq, qb, stream);
  b.lse = full_lse(ws, args.q, hd.hq, z.size);
  ops.copy(b.lse, lse, stream);
  auto like = [&](const TensorView& t, DType dtype) {
    return ws.tensor(dtype, {t.shape[0], t.shape[1], t.shape[2], t.shape[3]});
  };
  b.dq = like(b.q, args.q.dtype);
  b.dk = like(b.k, args.k.dtype);
  b.dv = like(b.v, args.v.dtype);
  flashattn::backward(b);
  scatter(ws, ops, comm, z, b.dq, args.dq, 1, 2, hd.hq, qb, false, stream);
  if (hd.hq >= hd.g) {  // every K/V head on one rank
    scatter(ws, ops, comm, z, b.dk, args.dk, 1, 2, hd.hk, kb, false, stream);
    scatter(ws, ops, comm, z, b.dv, args.dv, 1, 2, hd.hk, kb, false, stream);
  } else {  // a K/V head on several ranks: sum their gradients
    const TensorView dk = like(args.k, DType::f32), dv = like(args.v, DType::f32);
    ops.fill(dk, 0.0f, stream);
    ops.fill(dv, 0.0f, stream);
    scatter(ws, ops, comm, z, b.dk, dk, 1, 2, hd.hk, kb, true, stream);
    scatter(ws, ops, comm, z, b.dv, dv, 1, 2, hd.hk, kb, true, stream);
    ops.copy(args.dk, dk, stream);
    ops.copy(args.dv, dv, stream);
  }
}

}  // namespace flashattn::dist::detail
