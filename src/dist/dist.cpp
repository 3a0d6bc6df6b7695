// flashattn::dist entry points: validation of every argument, the zigzag description of the
// shards, then the ring or all-to-all algorithm (ring.cpp, all_to_all.cpp).
#include <string>
#include <vector>

#include "api/validate.hpp"
#include "dist/ops.hpp"
#include "dist/ring.hpp"
#include "flashattn/error.hpp"

namespace flashattn::dist {

const char* to_string(Strategy strategy) noexcept {
  return strategy == Strategy::ring ? "ring" : "all_to_all";
}

namespace {

[[noreturn]] void fail(ErrorKind kind, const std::string& argument, const std::string& expected,
                       const std::string& given) {
  throw Error(kind, argument, expected, given);
}

// A (batch = 1) fixed-length view of a packed (total, heads, d) tensor, for the library's own
// checks of dtypes, heads, head dims and strides.
TensorView batch_of_one(const TensorView& t) {
  if (t.rank != 3) return t;
  TensorView v = t;
  v.rank = 4;
  for (int i = 3; i > 0; --i) {
    v.shape[i] = t.shape[i - 1];
    v.stride[i] = t.stride[i - 1];
  }
  v.shape[0] = 1;
  v.stride[0] = t.shape[0] * t.stride[0];
  return v;
}
TensorView lse_batch_of_one(const TensorView& t) {
  if (t.rank != 2) return t;
  TensorView v = t;
  v.rank = 3;
  v.shape = {1, t.shape[0], t.shape[1], 0};
  v.stride = {t.shape[0] * t.stride[0], t.stride[0], t.stride[1], 0};
  return v;
}

// Checks what every call shares and describes the shards.
detail::Zigzag check(const AttentionOptions& a, const TensorView& q, const TensorView& k, Communicator& comm,
                     Strategy strategy) {
  detail::Zigzag z;
  z.size = comm.size();
  z.rank = comm.rank();
  if (z.size < 1 || z.rank < 0 || z.rank >= z.size)
    fail(ErrorKind::invalid_argument, "comm", "0 <= rank < size", std::to_string(z.rank) + " of " + std::to_string(z.size));
  if (comm.device() != q.device)
    fail(ErrorKind::invalid_type, "comm", std::string("a communicator for ") + flashattn::to_string(q.device) + " tensors",
         std::string("one for ") + flashattn::to_string(comm.device()) + " tensors");
  if (a.window_left != -1 || a.window_right != -1)
    fail(ErrorKind::unsupported, "window_size", "(-1, -1) (no sliding window across ranks)",
         "(" + std::to_string(a.window_left) + ", " + std::to_string(a.window_right) + ")");
  z.varlen = a.cu_seqlens_q.present() || a.cu_seqlens_k.present();
  const int seq = z.varlen ? 0 : 1;
  if (q.rank != (z.varlen ? 3 : 4))
    fail(ErrorKind::invalid_argument, "q", z.varlen ? "rank 3 (total, heads, head_dim)" : "rank 4", std::to_string(q.rank));
  if (k.rank != q.rank || k.shape[seq] != q.shape[seq])
    fail(ErrorKind::invalid_argument, "k", "the same sequence length as q (self-attention shards)",
         k.rank == q.rank ? std::to_string(k.shape[seq]) + " against " + std::to_string(q.shape[seq])
                          : "rank " + std::to_string(k.rank));
  if (q.shape[seq] % 2 != 0)
    fail(ErrorKind::invalid_argument, "q", "an even shard length (two zigzag chunks)", std::to_string(q.shape[seq]));
  z.half = q.shape[seq] / 2;
  if (strategy == Strategy::all_to_all) {
    if (z.varlen)
      fail(ErrorKind::unsupported, "cu_seqlens_q", "fixed-length batches with strategy all_to_all (ring takes cu_seqlens)",
           "cu_seqlens");
    const std::int64_t hq = q.shape[2], hk = k.shape[2];
    if (hq % z.size != 0)
      fail(ErrorKind::invalid_argument, "q", "heads_q a multiple of the ranks (" + std::to_string(z.size) + ") for all_to_all",
           std::to_string(hq) + " heads");
    if (hk > 0 && hq % hk == 0) {
      const std::int64_t per = hq / z.size, g = hq / hk;
      if (per % g != 0 && g % per != 0)
        fail(ErrorKind::invalid_argument, "k",
             "heads_q / ranks a multiple or a divisor of the GQA group heads_q / heads_kv (" + std::to_string(g) + ")",
             std::to_string(per) + " query heads per rank");
    }
  }
  if (z.varlen) {
    const TensorView& cq = a.cu_seqlens_q;
    const TensorView& ck = a.cu_seqlens_k;
    if (!cq.present() || !ck.present())
      fail(ErrorKind::invalid_argument, cq.present() ? "cu_seqlens_k" : "cu_seqlens_q", "both cu_seqlens or neither", "one");
    if (cq.dtype != DType::i32 || cq.rank != 1 || cq.shape[0] < 2 || cq.stride[0] != 1)
      fail(ErrorKind::invalid_argument, "cu_seqlens_q", "contiguous int32 (documents + 1)", "another tensor");
    if (ck.dtype != cq.dtype || ck.rank != 1 || ck.shape[0] != cq.shape[0] || ck.device != cq.device)
      fail(ErrorKind::invalid_argument, "cu_seqlens_k", "the same offsets as cu_seqlens_q (self-attention)",
           "another tensor");
    if (cq.device != q.device)
      fail(ErrorKind::invalid_type, "cu_seqlens_q", flashattn::to_string(q.device), flashattn::to_string(cq.device));
    if (a.max_seqlen_q <= 0 || a.max_seqlen_q != a.max_seqlen_k)
      fail(ErrorKind::invalid_argument, "max_seqlen_q", "the global longest document (> 0, equal to max_seqlen_k)",
           std::to_string(a.max_seqlen_q) + " and " + std::to_string(a.max_seqlen_k));
    z.documents = int(cq.shape[0] - 1);
    const int chunks = 2 * z.size;
    z.max_half = (a.max_seqlen_q + chunks - 1) / chunks;
    if (cq.device == DeviceKind::cpu) {
      const auto* oq = static_cast<const std::int32_t*>(cq.data);
      const auto* ok = static_cast<const std::int32_t*>(ck.data);
      if (oq[0] != 0) fail(ErrorKind::invalid_argument, "cu_seqlens_q", "offsets starting at 0", std::to_string(oq[0]));
      for (int i = 0; i <= z.documents; ++i) {
        if (oq[i] != ok[i])
          fail(ErrorKind::invalid_argument, "cu_seqlens_k", "the same offsets as cu_seqlens_q (self-attention)",
               "offset " + std::to_string(i) + " differs");
        if (i == 0) continue;
        const std::int64_t len = std::int64_t(oq[i]) - oq[i - 1];
        if (len < 0 || len % chunks != 0 || len > a.max_seqlen_q)
          fail(ErrorKind::invalid_argument, "cu_seqlens_q",
               "document lengths that are multiples of 2 * ranks (" + std::to_string(chunks) + ") and <= max_seqlen_q",
               "document " + std::to_string(i - 1) + " of length " + std::to_string(len));
      }
      if (std::int64_t(oq[z.documents]) != q.shape[0] * z.size)
        fail(ErrorKind::invalid_argument, "q", "total rows = cu_seqlens_q[-1] / ranks",
             std::to_string(q.shape[0]) + " rows, cu_seqlens_q[-1] = " + std::to_string(oq[z.documents]));
    }
  }
  return z;
}

template <class Args>
Args without_offsets(const Args& args) {
  Args v = args;
  v.cu_seqlens_q = TensorView{};
  v.cu_seqlens_k = TensorView{};
  v.max_seqlen_q = v.max_seqlen_k = 0;
  return v;
}

// The offsets of one zigzag chunk of every document, on q's device, for the duration of a call.
struct ChunkOffsets {
  const detail::DeviceOps& ops;
  void* stream;
  std::int32_t* data = nullptr;
  ChunkOffsets(detail::Zigzag& z, const AttentionOptions& a, DeviceKind device)
      : ops(detail::ops_for(device)), stream(a.stream) {
    if (!z.varlen) return;
    data = static_cast<std::int32_t*>(ops.allocate(std::size_t(z.documents + 1) * 4, stream));
    ops.divide_offsets(data, static_cast<const std::int32_t*>(a.cu_seqlens_q.data), z.documents + 1, 2 * z.size,
                       stream);
    z.cu_half = data;
  }
  ~ChunkOffsets() {
    if (data) ops.release(data, stream);
  }
};

}  // namespace

void forward(const ForwardArgs& args, Communicator& comm, Strategy strategy) {
  detail::Zigzag z = check(args, args.q, args.k, comm, strategy);
  ForwardArgs probe = without_offsets(args);
  probe.q = batch_of_one(args.q);
  probe.k = batch_of_one(args.k);
  probe.v = batch_of_one(args.v);
  probe.out = batch_of_one(args.out);
  probe.lse = lse_batch_of_one(args.lse);
  (void)flashattn::detail::make_forward_problem(probe);
  ChunkOffsets offsets(z, args, args.q.device);
  if (strategy == Strategy::ring)
    detail::ring_forward(args, comm, z);
  else
    detail::all_to_all_forward(args, comm, z);
}

void backward(const BackwardArgs& args, Communicator& comm, Strategy strategy) {
  detail::Zigzag z = check(args, args.q, args.k, comm, strategy);
  BackwardArgs probe = without_offsets(args);
  probe.q = batch_of_one(args.q);
  probe.k = batch_of_one(args.k);
  probe.v = batch_of_one(args.v);
  probe.out = batch_of_one(args.out);
  probe.dout = batch_of_one(args.dout);
  probe.dq = batch_of_one(args.dq);
  probe.dk = batch_of_one(args.dk);
  probe.dv = batch_of_one(args.dv);
  probe.lse = lse_batch_of_one(args.lse);
  (void)flashattn::detail::make_backward_problem(probe);
  ChunkOffsets offsets(z, args, args.q.device);
  if (strategy == Strategy::ring)
    detail::ring_backward(args, comm, z);
  else
    detail::all_to_all_backward(args, comm, z);
}

}  // namespace flashattn::dist
