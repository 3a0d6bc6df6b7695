#pragma once
// The context-parallel check shared by the CPU (test_distributed.cpp) and the CUDA
// (test_distributed_cuda.cpp) tests: global random inputs, one single-process call of the library
// on the whole sequence, every rank on its own thread running flashattn::dist on its zigzag
// shards, each rank's outputs, LSE and gradients compared with its shard of the single result.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/numeric.hpp"
#include "flashattn/distributed.hpp"
#include "flashattn/error.hpp"
#include "flashattn/flashattn.hpp"

namespace flashattn::testing::distributed {

// A host tensor of f32/f16/bf16 values, contiguous.
struct Host {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::vector<std::uint8_t> bytes;
  Host() = default;
  Host(DType d, std::vector<std::int64_t> s) : dtype(d), shape(std::move(s)) { bytes.resize(numel() * element_size(d)); }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto x : shape) n *= x;
    return n;
  }
  float get(std::int64_t i) const {
    if (dtype == DType::f32) return reinterpret_cast<const float*>(bytes.data())[i];
    const std::uint16_t h = reinterpret_cast<const std::uint16_t*>(bytes.data())[i];
    return dtype == DType::bf16 ? flashattn::detail::bf16_to_float(h) : flashattn::detail::half_to_float(h);
  }
  void set(std::int64_t i, float x) {
    if (dtype == DType::f32)
      reinterpret_cast<float*>(bytes.data())[i] = x;
    else
      reinterpret_cast<std::uint16_t*>(bytes.data())[i] =
          dtype == DType::bf16 ? flashattn::detail::float_to_bf16(x) : flashattn::detail::float_to_half(x);
  }
  TensorView view() {
    TensorView t;
    t.data = bytes.data();
    t.dtype = dtype;
    t.rank = int(shape.size());
    std::int64_t stride = 1;
    for (int i = t.rank - 1; i >= 0; --i) {
      t.shape[i] = shape[i];
      t.stride[i] = stride;
      stride *= shape[i];
    }
    return t;
  }
};

struct Config {
  int ranks = 2;
  int batch = 1, chunk = 3, heads_q = 4, heads_kv = 2, head_dim = 16;
  bool causal = true, varlen = false;
  std::vector<int> documents;  // varlen: lengths (multiples of 2 * ranks)
  float softcap = 0.0f;
  DType dtype = DType::f32;
  dist::Strategy strategy = dist::Strategy::ring;
  double tolerance16 = 2e-2;  // relative error allowed in f16/bf16 against the single-process result
  bool strided_kv = false;    // each rank's K and V are views that skip a head: not contiguous
  std::string name() const {
    return std::to_string(ranks) + " ranks " + dist::to_string(strategy) + (causal ? " causal" : "") +
           (varlen ? " varlen" : "") + " h " + std::to_string(heads_q) + "/" + std::to_string(heads_kv) + " " +
           to_string(dtype) + (softcap > 0 ? " softcap" : "") + (strided_kv ? " strided K/V" : "");
  }
};

double rel_error(const Host& a, const Host& b) {
  double num = 0, den = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double d = double(a.get(i)) - b.get(i);
    num += d * d;
    den += double(b.get(i)) * b.get(i);
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

// The global sequence row each local row of rank r holds (packed rows for variable length).
std::vector<std::int64_t> zigzag_rows(const Config& c, int r) {
  const int chunks = 2 * c.ranks;
  std::vector<std::int64_t> rows;
  for (int h = 0; h < 2; ++h) {
    const int chunk = h == 0 ? r : chunks - 1 - r;
    if (!c.varlen) {
      for (int t = 0; t < c.chunk; ++t) rows.push_back(std::int64_t(chunk) * c.chunk + t);
    } else {
      std::int64_t start = 0;
      for (int len : c.documents) {
        const int l = len / chunks;
        for (int t = 0; t < l; ++t) rows.push_back(start + std::int64_t(chunk) * l + t);
        start += len;
      }
    }
  }
  return rows;
}

// Local (rank r's) copy of a global tensor whose sequence dimension is `seq`.
Host shard(const Host& g, int seq, const std::vector<std::int64_t>& rows) {
  std::vector<std::int64_t> shape = g.shape;
  shape[seq] = std::int64_t(rows.size());
  Host l(g.dtype, shape);
  std::int64_t outer = 1, inner = 1;
  for (int i = 0; i < seq; ++i) outer *= g.shape[i];
  for (std::size_t i = seq + 1; i < g.shape.size(); ++i) inner *= g.shape[i];
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::size_t t = 0; t < rows.size(); ++t)
      for (std::int64_t i = 0; i < inner; ++i)
        l.set((o * std::int64_t(rows.size()) + t) * inner + i, g.get((o * g.shape[seq] + rows[t]) * inner + i));
  return l;
}

// Where the ranks' tensors live and how they talk: the CPU with threads (test_distributed.cpp)
// or one GPU per rank with NCCL (test_distributed_cuda.cpp).
class Placement {
 public:
  virtual ~Placement() = default;
  virtual void prepare(int ranks) = 0;  // before the ranks' threads start
  // On rank r's thread: its communicator (NCCL: every rank's thread must call it at once).
  virtual std::unique_ptr<dist::Communicator> join(int r) = 0;
  // A tensor on rank r's device with h's contents (kept until the placement goes away).
  virtual TensorView put(Host& h, int r) = 0;
  virtual void get(Host& h, const TensorView& t, int r) = 0;  // after sync(r)
  virtual void* stream(int r) = 0;
  virtual void sync(int r) = 0;
};

void run_case(const Config& c, Placement& place) {
  SCOPED_TRACE(c.name());
  const int R = c.ranks;
  std::int64_t total = 0;
  for (int len : c.documents) total += len;
  const std::int64_t n = c.varlen ? total : std::int64_t(2) * R * c.chunk;
  auto qshape = [&](int heads) {
    return c.varlen ? std::vector<std::int64_t>{n, heads, c.head_dim} : std::vector<std::int64_t>{c.batch, n, heads, c.head_dim};
  };
  std::mt19937 gen(1234 + R);
  std::normal_distribution<float> normal;
  auto random = [&](std::vector<std::int64_t> s) {
    Host h(c.dtype, s);
    for (std::int64_t i = 0; i < h.numel(); ++i) h.set(i, normal(gen));
    return h;
  };
  Host q = random(qshape(c.heads_q)), k = random(qshape(c.heads_kv)), v = random(qshape(c.heads_kv));
  Host dout = random(qshape(c.heads_q));
  const std::vector<std::int64_t> lse_shape =
      c.varlen ? std::vector<std::int64_t>{c.heads_q, n} : std::vector<std::int64_t>{c.batch, c.heads_q, n};
  Host cu(DType::i32, {std::int64_t(c.documents.size()) + 1});
  {
    auto* p = reinterpret_cast<std::int32_t*>(cu.bytes.data());
    p[0] = 0;
    for (std::size_t i = 0; i < c.documents.size(); ++i) p[i + 1] = p[i] + c.documents[i];
  }
  int max_len = 0;
  for (int len : c.documents) max_len = std::max(max_len, len);
  place.prepare(R);
  std::vector<TensorView> cu_on(R);
  for (int r = 0; r < R; ++r) cu_on[r] = place.put(cu, r);
  auto options = [&](AttentionOptions& a, int r) {
    a.causal = c.causal;
    a.softcap = c.softcap;
    a.stream = place.stream(r);
    if (c.varlen) {
      a.cu_seqlens_q = a.cu_seqlens_k = cu_on[r];
      a.max_seqlen_q = a.max_seqlen_k = max_len;
    }
  };

  // The single-process result.
  Host out(c.dtype, q.shape), lse(DType::f32, lse_shape);
  Host dq(c.dtype, q.shape), dk(c.dtype, k.shape), dv(c.dtype, v.shape);
  {
    ForwardArgs f;
    options(f, 0);
    f.q = place.put(q, 0), f.k = place.put(k, 0), f.v = place.put(v, 0);
    f.out = place.put(out, 0), f.lse = place.put(lse, 0);
    flashattn::forward(f);
    BackwardArgs b;
    options(b, 0);
    b.q = f.q, b.k = f.k, b.v = f.v, b.out = f.out, b.lse = f.lse, b.dout = place.put(dout, 0);
    b.dq = place.put(dq, 0), b.dk = place.put(dk, 0), b.dv = place.put(dv, 0);
    flashattn::backward(b);
    place.sync(0);
    place.get(out, f.out, 0), place.get(lse, f.lse, 0);
    place.get(dq, b.dq, 0), place.get(dk, b.dk, 0), place.get(dv, b.dv, 0);
  }

  const int seq = c.varlen ? 0 : 1, lse_seq = c.varlen ? 1 : 2;
  std::vector<Host> lq(R), lk(R), lv(R), ldo(R), lout(R), llse(R), ldq(R), ldk(R), ldv(R);
  std::vector<std::string> errors(R);
  std::vector<std::thread> threads;
  for (int r = 0; r < R; ++r) {
    const auto rows = zigzag_rows(c, r);
    lq[r] = shard(q, seq, rows), lk[r] = shard(k, seq, rows), lv[r] = shard(v, seq, rows);
    ldo[r] = shard(dout, seq, rows);
    lout[r] = Host(c.dtype, lq[r].shape), ldq[r] = Host(c.dtype, lq[r].shape);
    ldk[r] = Host(c.dtype, lk[r].shape), ldv[r] = Host(c.dtype, lv[r].shape);
    std::vector<std::int64_t> ls = lse_shape;
    ls[lse_seq] = std::int64_t(rows.size());
    llse[r] = Host(DType::f32, ls);
  }
  // With c.strided_kv: K and V as the first heads of a buffer with one head more.
  std::vector<Host> padded_k(R), padded_v(R);
  auto put_kv = [&](Host& h, Host& padded, int r) {
    if (!c.strided_kv) return place.put(h, r);
    std::vector<std::int64_t> s = h.shape;
    const std::int64_t heads = s[s.size() - 2], d = s.back(), rows = h.numel() / (heads * d);
    s[s.size() - 2] = heads + 1;
    padded = Host(h.dtype, s);
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < heads * d; ++j) padded.set(i * (heads + 1) * d + j, h.get(i * heads * d + j));
    TensorView t = place.put(padded, r);
    t.shape[t.rank - 2] = heads;
    return t;
  };
  for (int r = 0; r < R; ++r)
    threads.emplace_back([&, r] {
      try {
        auto comm = place.join(r);
        ForwardArgs f;
        options(f, r);
        f.q = place.put(lq[r], r), f.k = put_kv(lk[r], padded_k[r], r), f.v = put_kv(lv[r], padded_v[r], r);
        f.out = place.put(lout[r], r), f.lse = place.put(llse[r], r);
        dist::forward(f, *comm, c.strategy);
        BackwardArgs b;
        options(b, r);
        b.q = f.q, b.k = f.k, b.v = f.v, b.out = f.out, b.lse = f.lse, b.dout = place.put(ldo[r], r);
        b.dq = place.put(ldq[r], r), b.dk = place.put(ldk[r], r), b.dv = place.put(ldv[r], r);
        dist::backward(b, *comm, c.strategy);
        place.sync(r);
        place.get(lout[r], f.out, r), place.get(llse[r], f.lse, r);
        place.get(ldq[r], b.dq, r), place.get(ldk[r], b.dk, r), place.get(ldv[r], b.dv, r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < R; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;

  const double tol = c.dtype == DType::f32 ? 2e-5 : c.tolerance16;
  for (int r = 0; r < R; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const auto rows = zigzag_rows(c, r);
    EXPECT_LE(rel_error(lout[r], shard(out, seq, rows)), tol);
    EXPECT_LE(rel_error(llse[r], shard(lse, lse_seq, rows)), 1e-5);
    EXPECT_LE(rel_error(ldq[r], shard(dq, seq, rows)), tol);
    EXPECT_LE(rel_error(ldk[r], shard(dk, seq, rows)), tol);
    EXPECT_LE(rel_error(ldv[r], shard(dv, seq, rows)), tol);
  }
}


}  // namespace flashattn::testing::distributed
