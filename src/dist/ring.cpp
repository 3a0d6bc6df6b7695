// Ring attention over zigzag shards (include/flashattn/distributed.hpp). The arguments were
// validated by dist.cpp; `z` describes the shards.
//
// Forward: K/V of this rank go into buffer 0; at step i this rank holds the K/V of rank
// r - i, starts sending them on to r + 1 (and receiving r - i - 1's into the other buffer),
// runs its attention calls against them and merges each partial output through the LSEs: a
// query half's first call starts a float32 accumulator, its last merges into the output.
// Backward: the same walk with this rank's own calls split around it (ring_backward says why);
// each step's dK/dV go into float32 accumulators that travel one step behind the K/V and come
// home while the last phase computes.
#include "dist/ring.hpp"

#include <limits>
#include <vector>

#include "dist/ops.hpp"
#include "dist/workspace.hpp"

namespace flashattn::dist::detail {
namespace {

struct KV {
  TensorView k, v;
};

// The calls of the walk: step i against the K/V of rank r - i (ring_works), and how many calls
// each query half gets (its first starts an accumulator, its last writes the output).
struct Walk {
  struct Step {
    RingWork works[4];
    int count = 0;
  };
  std::vector<Step> steps;
  int calls[2] = {0, 0};
};

Walk plan_walk(const Zigzag& z, int r, bool causal) {
  Walk w;
  w.steps.resize(z.size);
  for (int i = 0; i < z.size; ++i) {
    Walk::Step& step = w.steps[i];
    step.count = ring_works(z, r, (r + z.size - i) % z.size, causal, step.works);
    for (int j = 0; j < step.count; ++j) ++w.calls[step.works[j].qh];
  }
  return w;
}

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

// This rank's K/V as the first step's send buffer: the caller's tensors when contiguous (a send
// only reads them), else a contiguous copy.
KV sendable(Workspace& ws, const DeviceOps& ops, const KV& own, void* stream) {
  if (contiguous(own.k) && contiguous(own.v)) return own;
  KV b = kv_buffer(ws, own.k.dtype, own.k, own.v);
  ops.copy(b.k, own.k, stream);
  ops.copy(b.v, own.v, stream);
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

  // Step 0 computes on this rank's K/V and sends them; step i >= 1 computes on kv[i % 2] while the
  // next K/V arrive in the other buffer (kv[0] is needed from three ranks on).
  const KV mine{args.k, args.v};
  KV kv[2];
  if (R > 1) kv[1] = kv_buffer(ws, args.k.dtype, args.k, args.v);
  if (R > 2) kv[0] = kv_buffer(ws, args.k.dtype, args.k, args.v);
  const KV first = R > 1 ? sendable(ws, ops, mine, stream) : mine;

  const Walk walk = plan_walk(z, r, args.causal);
  const int* calls = walk.calls;
  int seen[2] = {0, 0};
  const bool merges = calls[0] > 1 || calls[1] > 1;
  const TensorView out_acc = merges ? like(ws, DType::f32, args.q) : TensorView{};
  TensorView lse_acc[2], lse_step[2], out_step[2];
  for (int h = 0; h < 2; ++h) {
    lse_acc[h] = half_lse(ws, z, args.q);
    lse_step[h] = half_lse(ws, z, args.q);
    out_step[h] = like(ws, args.q.dtype, z.part(args.q, 0));
  }

  for (int i = 0; i < R; ++i) {
    const KV& held = i == 0 ? mine : kv[i % 2];
    const KV& send = i == 0 ? first : kv[i % 2];
    const KV& coming = kv[(i + 1) % 2];
    const int ticket = i + 1 < R ? comm.start_exchange({bytes_of(send.k), bytes_of(send.v)}, next,
                                                       {bytes_of(coming.k), bytes_of(coming.v)}, prev, stream)
                                 : -1;
    for (int j = 0; j < walk.steps[i].count; ++j) {
      const RingWork& w = walk.steps[i].works[j];
      ForwardArgs f;
      set_work_options(f, args, z, w);
      f.sm_margin = ticket >= 0 ? args.sm_margin : 0;  // SMs for the transfer's kernels
      f.q = z.part(args.q, w.qh);
      f.k = z.part(held.k, w.kp);
      f.v = z.part(held.v, w.kp);
      f.out = out_step[w.qh];
      f.lse = lse_step[w.qh];
      flashattn::forward(f);
      const int call = ++seen[w.qh];
      const bool last = call == calls[w.qh];
      const TensorView out = last ? z.part(args.out, w.qh) : z.part(out_acc, w.qh);
      const TensorView lse = last && args.lse.present() ? z.lse_part(args.lse, w.qh) : lse_acc[w.qh];
      if (call == 1) {
        ops.copy(out, out_step[w.qh], stream);
        ops.copy(lse, lse_step[w.qh], stream);
      } else {
        ops.merge(out, z.lse_rows(lse), z.part(out_acc, w.qh), z.lse_rows(lse_acc[w.qh]), out_step[w.qh],
                  z.lse_rows(lse_step[w.qh]), stream);
      }
    }
    if (ticket >= 0) comm.finish_exchange(ticket, stream);
  }
  for (int h = 0; h < 2; ++h) {
    if (calls[h] > 0) continue;  // no key in reach (not with the zigzag's own diagonal; kept for safety)
    ops.fill(z.part(args.out, h), 0.0f, stream);
    if (args.lse.present()) ops.fill(z.lse_part(args.lse, h), -std::numeric_limits<float>::infinity(), stream);
  }
}

void ring_backward(const BackwardArgs& args, Communicator& comm, const Zigzag& z) {
  const DeviceOps& ops = ops_for(args.q.device);
  void* stream = args.stream;
  Workspace ws(ops, args.q.device, args.q.device_index, stream);
  const int R = z.size, r = z.rank, next = (r + 1) % R, prev = (r + R - 1) % R;

  // K/V in flight: this rank's go out first, step i >= 1 computes on kv[i % 2] while the next K/V
  // arrive in the other buffer (kv[0] is needed from three ranks on). acc[i % 2] is the float32
  // dK/dV accumulator of the K/V of step i.
  const KV mine{args.k, args.v};
  KV kv[2], acc[2], first;
  if (R > 1) {
    kv[1] = kv_buffer(ws, args.k.dtype, args.k, args.v);
    if (R > 2) kv[0] = kv_buffer(ws, args.k.dtype, args.k, args.v);
    first = sendable(ws, ops, mine, stream);
    acc[1] = kv_buffer(ws, DType::f32, args.k, args.v);
  }
  acc[0] = kv_buffer(ws, DType::f32, args.k, args.v);
  ops.fill(acc[0].k, 0.0f, stream);
  ops.fill(acc[0].v, 0.0f, stream);

  const TensorView dq_acc = like(ws, DType::f32, args.q);
  const TensorView dq_step = like(ws, args.q.dtype, z.part(args.q, 0));
  TensorView lse[2];
  for (int h = 0; h < 2; ++h) {
    lse[h] = half_lse(ws, z, args.q);
    ops.copy(lse[h], z.lse_part(args.lse, h), stream);
  }
  // This rank's own calls split in two phases (below), and how many calls each query half gets
  // over the whole walk (its first starts the dQ accumulator, its last writes dq).
  const Walk walk = plan_walk(z, r, args.causal);
  const int* dq_calls = walk.calls;
  int dq_seen[2] = {0, 0};
  RingWork part_a[4], part_b[4];
  int n_a = 0, n_b = 0;
  for (int j = 0; j < walk.steps[0].count; ++j) {
    const RingWork& w = walk.steps[0].works[j];
    (w.qh == 0 ? part_a[n_a++] : part_b[n_b++]) = w;
  }
  // dK/dV of each call of a phase, added into the accumulator once it has arrived.
  KV dkv_step[4];
  int slots = 0;
  auto compute = [&](const RingWork* works, int n, const KV& held) {
    for (int j = 0; j < n; ++j) {
      const RingWork& w = works[j];
      if (j >= slots) dkv_step[slots++] = kv_buffer(ws, args.k.dtype, args.k, args.v);
      BackwardArgs b;
      set_work_options(b, args, z, w);
      b.sm_margin = R > 1 ? args.sm_margin : 0;  // SMs for the transfer's kernels
      b.deterministic = args.deterministic;
      b.q = z.part(args.q, w.qh);
      b.k = z.part(held.k, w.kp);
      b.v = z.part(held.v, w.kp);
      b.out = z.part(args.out, w.qh);
      b.dout = z.part(args.dout, w.qh);
      b.lse = lse[w.qh];
      b.dq = dq_step;
      b.dk = z.part(dkv_step[j].k, w.kp);
      b.dv = z.part(dkv_step[j].v, w.kp);
      flashattn::backward(b);
      // A query half's first call starts its dQ accumulator, its last one writes dq.
      const int call = ++dq_seen[w.qh];
      const TensorView into = call == dq_calls[w.qh] ? z.part(args.dq, w.qh) : z.part(dq_acc, w.qh);
      if (call == 1)
        ops.copy(into, dq_step, stream);
      else
        ops.add(into, z.part(dq_acc, w.qh), dq_step, stream);
    }
  };
  auto accumulate = [&](const RingWork* works, int n, const KV& into) {
    for (int j = 0; j < n; ++j) {
      const int kp = works[j].kp;
      ops.add(z.part(into.k, kp), z.part(into.k, kp), z.part(dkv_step[j].k, kp), stream);
      ops.add(z.part(into.v, kp), z.part(into.v, kp), z.part(dkv_step[j].v, kp), stream);
    }
  };
  auto exchange = [&](const std::vector<Buffer>& send, const std::vector<Buffer>& recv) {
    return comm.start_exchange(send, next, recv, prev, stream);
  };

  // The walk, so that no transfer is left without compute to hide under: this rank's own work
  // is split in two phases, query half 0 first and query half 1 last.
  //   A:         own K/V go to the next rank while the calls of query half 0 run on them;
  //   step i:    K/V of rank r - i (1 <= i < R); its accumulator arrives from the previous rank
  //              (which computed on those K/V a step earlier) while this rank computes, and the
  //              previous step's accumulator and K/V go on to the next rank;
  //   B:         query half 1 against own K/V, while own accumulator comes home.
  int ticket = R > 1 ? exchange({bytes_of(first.k), bytes_of(first.v)}, {bytes_of(kv[1].k), bytes_of(kv[1].v)}) : -1;
  compute(part_a, n_a, mine);
  if (ticket >= 0) comm.finish_exchange(ticket, stream);
  accumulate(part_a, n_a, acc[0]);
  for (int i = 1; i < R; ++i) {
    const KV &held = kv[i % 2], &here = acc[i % 2], &last = acc[(i - 1) % 2];
    std::vector<Buffer> send{bytes_of(last.k), bytes_of(last.v)}, recv{bytes_of(here.k), bytes_of(here.v)};
    if (i + 1 < R) {
      const KV& coming = kv[(i + 1) % 2];
      send.insert(send.end(), {bytes_of(held.k), bytes_of(held.v)});
      recv.insert(recv.end(), {bytes_of(coming.k), bytes_of(coming.v)});
    }
    ticket = exchange(send, recv);
    const Walk::Step& step = walk.steps[i];
    compute(step.works, step.count, held);
    comm.finish_exchange(ticket, stream);
    accumulate(step.works, step.count, here);
  }
  const KV& home = acc[R > 1 ? R % 2 : 0];
  if (R > 1) {
    const KV& last = acc[(R - 1) % 2];
    ticket = exchange({bytes_of(last.k), bytes_of(last.v)}, {bytes_of(home.k), bytes_of(home.v)});
  }
  compute(part_b, n_b, mine);
  if (R > 1) comm.finish_exchange(ticket, stream);
  // Phase B adds into the accumulator that came home; the last of its calls to reach a key half
  // writes that half's sum straight into dk / dv, and halves it does not reach are copied.
  int last_b[2] = {-1, -1};
  for (int j = 0; j < n_b; ++j)
    for (int h = 0; h < 2; ++h)
      if (part_b[j].kp == h || part_b[j].kp == 2) last_b[h] = j;
  for (int j = 0; j < n_b; ++j)
    for (int h = 0; h < 2; ++h) {
      if (part_b[j].kp != h && part_b[j].kp != 2) continue;
      const bool last = last_b[h] == j;
      ops.add(last ? z.part(args.dk, h) : z.part(home.k, h), z.part(home.k, h), z.part(dkv_step[j].k, h), stream);
      ops.add(last ? z.part(args.dv, h) : z.part(home.v, h), z.part(home.v, h), z.part(dkv_step[j].v, h), stream);
    }
  for (int h = 0; h < 2; ++h) {
    if (last_b[h] >= 0) continue;
    ops.copy(z.part(args.dk, h), z.part(home.k, h), stream);
    ops.copy(z.part(args.dv, h), z.part(home.v, h), stream);
  }
  for (int h = 0; h < 2; ++h)
    if (dq_calls[h] == 0) ops.fill(z.part(args.dq, h), 0.0f, stream);  // no key in reach (kept for safety)
}

}  // namespace flashattn::dist::detail
