// The CPU backward: FlashAttention-2's backward on fp32 tiles.
//
// Per (query block i, key block j) it recomputes the scores from Q, K and the saved LSE
// (P = exp(S - LSE)), then dP = dO V^T, dS = P * (dP - D) with D = rowsum(dO * O), and
// accumulates dV_j += P^T dO, dK_j += dS^T Q and dQ_i += dS K_j: five small products, all
// through the micro-kernel of gemm.hpp, on transposed (keys x queries) score tiles.
//
// Parallelism without races or atomics. A task owns one KV head of one sequence (and, when
// there are few of those, one contiguous range of its keys, a "split"): it converts its K and
// V rows to fp32 once, keeps fp32 dK and dV accumulators for them, and walks every query
// block of every query head of the group (GQA sums over the group in a fixed order), with the
// key blocks innermost so that dQ_i is complete when the walk leaves block i. With one split
// the task writes dQ directly; with several, each split writes its share of dQ into its own
// fp32 buffer and a second parallel pass adds the shares in split order. The number of splits
// depends only on the problem's shape, never on the thread count, so the result is the same
// bits on every run and with any number of threads. Extra memory: the task's K, V, dK, dV rows
// (O(seqlen * head_dim) per thread) plus, with splits, the dQ shares (splits x dQ in fp32,
// capped at kMaxShareBytes).
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "cpu/backend.hpp"
#include "cpu/dropout.hpp"
#include "cpu/gemm.hpp"
#include "cpu/score_tile.hpp"
#include "cpu/tile.hpp"

namespace flashattn::cpu {
namespace {

constexpr int kQueryBlock = 64;  // query rows per step: the vector dimension of the score tiles
constexpr int kKeyBlock = 64;    // keys per step
static_assert(kQueryBlock % kMicroCols == 0);

// Split the keys of each KV head until there are this many tasks, but keep at least
// kMinSplitKeys keys per split and the dQ shares under kMaxShareBytes.
constexpr int kTargetTasks = 32;
constexpr int kMinSplitKeys = 256;
constexpr double kMaxShareBytes = 512.0 * 1024 * 1024;

struct Plan {
  int splits = 1;
  std::int64_t total_q = 0;  // query rows over all sequences (the dQ shares' row count)
  int width = 0;             // head_dim rounded up to whole vectors

  // Row of query row i of sequence b in the shares.
  std::int64_t share_row(const detail::Problem& p, int b, int i) const {
    return (p.is_varlen() ? p.cu_seqlens_q[b] : std::int64_t(b) * p.seqlen_q) + i;
  }
};

Plan make_plan(const detail::BackwardProblem& p) {
  Plan plan;
  plan.width = round_up(p.head_dim, simd::kLanes);
  plan.total_q = p.is_varlen() ? p.cu_seqlens_q[p.batch] : std::int64_t(p.batch) * p.seqlen_q;
  const int heads = std::max(1, p.batch * p.heads_kv);
  int splits = (kTargetTasks + heads - 1) / heads;
  splits = std::min(splits, std::max(1, p.seqlen_k / kMinSplitKeys));
  const double share_bytes = double(plan.total_q) * p.heads_q * plan.width * sizeof(float);
  if (share_bytes > 0) splits = std::min(splits, int(std::max(1.0, kMaxShareBytes / share_bytes)));
  plan.splits = std::max(1, splits);
  return plan;
}

struct Task {
  int batch, kv_head, split;
};

// Keys [begin, end) of one split: whole key blocks, spread evenly over the splits.
struct KeyRange {
  int begin, end;
};
KeyRange split_keys(int rows_k, int split, int splits) {
  const int blocks = (rows_k + kKeyBlock - 1) / kKeyBlock;
  const int b0 = int(std::int64_t(blocks) * split / splits), b1 = int(std::int64_t(blocks) * (split + 1) / splits);
  return {std::min(b0 * kKeyBlock, rows_k), std::min(b1 * kKeyBlock, rows_k)};
}

// One thread's tiles. Key rows grow to the largest split the thread meets.
struct Workspace {
  Workspace(int head_dim, int width)
      : q(std::size_t(kQueryBlock) * width),
        q_t(std::size_t(head_dim) * kQueryBlock),
        dout(std::size_t(kQueryBlock) * width),
        dout_t(std::size_t(head_dim) * kQueryBlock),
        dq(std::size_t(kQueryBlock) * width),
        s(std::size_t(kKeyBlock) * kQueryBlock),
        dp(std::size_t(kKeyBlock) * kQueryBlock),
        tanh(std::size_t(kKeyBlock) * kQueryBlock),
        scratch(2 * std::size_t(width)) {}

  void reserve_keys(int keys, int width) {
    const std::size_t n = std::size_t(keys) * width;
    for (FloatBuffer* b : {&k, &v, &dk, &dv})
      if (b->size() < n) b->resize(n);
  }

  FloatBuffer k, v, dk, dv;  // the split's keys x width: K and V in fp32, dK and dV accumulators
  FloatBuffer q, q_t;        // query block: rows x width, and transposed + pre-scaled
  FloatBuffer dout, dout_t;  // dO block: rows x width, and transposed
  FloatBuffer dq;            // rows x width accumulator
  FloatBuffer s, dp, tanh;   // keys x queries: P, dP then dS, tanh of the scores (softcap)
  FloatBuffer z;             // keys x queries: dropout's keep factors (dropout only)
  FloatBuffer scratch;
  alignas(64) float delta[kQueryBlock];  // D = rowsum(dO * O)
  alignas(64) float lse[kQueryBlock];    // LSE, +inf for rows that see nothing
};

class BackwardTask {
 public:
  BackwardTask(const detail::BackwardProblem& p, const Plan& plan, const DropoutStream& rng, float* shares,
               const Task& task, Workspace& ws)
      : p_(p), plan_(plan), rng_(rng), shares_(shares), task_(task), ws_(ws), seq_(sequence(p, task.batch)),
        keys_(split_keys(seq_.rows_k, task.split, plan.splits)) {
    if (rng_.enabled && ws_.z.empty()) ws_.z.resize(std::size_t(kKeyBlock) * kQueryBlock);
  }

  void run() {
    const int width = plan_.width, head_dim = p_.head_dim;
    const int key_count = keys_.end - keys_.begin;
    ws_.reserve_keys(key_count, width);
    const RowsView k = rows_view(p_.dtype, p_.k, task_.batch, seq_.offset_k, task_.kv_head);
    const RowsView v = rows_view(p_.dtype, p_.v, task_.batch, seq_.offset_k, task_.kv_head);
    load_tile(k, keys_.begin, key_count, key_count, head_dim, ws_.k.data(), width);
    load_tile(v, keys_.begin, key_count, key_count, head_dim, ws_.v.data(), width);
    std::fill_n(ws_.dk.data(), std::size_t(key_count) * width, 0.0f);
    std::fill_n(ws_.dv.data(), std::size_t(key_count) * width, 0.0f);

    const int group = p_.group_size();
    for (int h = task_.kv_head * group; h < (task_.kv_head + 1) * group; ++h)
      for (int row0 = 0; row0 < seq_.rows_q; row0 += kQueryBlock)
        query_block(h, row0, std::min(kQueryBlock, seq_.rows_q - row0));

    const RowsView dk = rows_view(p_.dtype, p_.dk, task_.batch, seq_.offset_k, task_.kv_head);
    const RowsView dv = rows_view(p_.dtype, p_.dv, task_.batch, seq_.offset_k, task_.kv_head);
    for (int j = 0; j < key_count; ++j) {
      store_row(dk, keys_.begin + j, ws_.dk.data() + std::int64_t(j) * width, head_dim, p_.scale);
      store_row(dv, keys_.begin + j, ws_.dv.data() + std::int64_t(j) * width, head_dim, 1.0f);
    }
  }

 private:
  void query_block(int h, int row0, int rows) {
    const int width = plan_.width, head_dim = p_.head_dim;
    const QueryBlockKeys<kQueryBlock> visible(p_, seq_, row0, rows);
    const int key_begin = std::max(visible.key_begin, keys_.begin);
    const int key_end = std::min(visible.key_end, keys_.end);
    float* dq = ws_.dq.data();
    std::fill_n(dq, std::size_t(kQueryBlock) * width, 0.0f);

    if (key_begin < key_end) {
      load_query_block(h, row0, rows);
      for (int key0 = key_begin; key0 < key_end; key0 += kKeyBlock) {
        const int n = std::min(kKeyBlock, key_end - key0);
        const float* k_j = ws_.k.data() + std::int64_t(key0 - keys_.begin) * width;
        const float* v_j = ws_.v.data() + std::int64_t(key0 - keys_.begin) * width;
        float* dk_j = ws_.dk.data() + std::int64_t(key0 - keys_.begin) * width;
        float* dv_j = ws_.dv.data() + std::int64_t(key0 - keys_.begin) * width;
        float *s = ws_.s.data(), *dp = ws_.dp.data(), *tanh = ws_.tanh.data();

        // P^T = exp(K Q^T - LSE): the forward's scores, bit for bit (see query_prescale).
        gemm(n, kQueryBlock, head_dim, {k_j, width, 1}, ws_.q_t.data(), kQueryBlock, s, kQueryBlock, false);
        if (p_.softcap > 0) softcap_scores(s, n * kQueryBlock, p_.softcap, tanh);
        if (p_.alibi.enabled())
          alibi_scores<kQueryBlock>(s, n, key0, row0, seq_.rows_k - seq_.rows_q, p_.alibi.slope(task_.batch, h));
        if (!visible.sees_all(key0, key0 + n)) mask_scores(s, n, key0, visible);
        probabilities_from_lse<kQueryBlock>(s, n, ws_.lse);
        // dP^T = V dO^T, then dS^T in its place.
        gemm(n, kQueryBlock, head_dim, {v_j, width, 1}, ws_.dout_t.data(), kQueryBlock, dp, kQueryBlock, false);
        if (rng_.enabled) {  // dropout (keep factors z): dS = P (dP z - D), dV += (P z)^T dO
          rng_.factors<kQueryBlock>(task_.batch, h, row0, rows, key0, n, ws_.z.data());
          for (std::int64_t i = 0; i < std::int64_t(n) * kQueryBlock; ++i) dp[i] *= ws_.z[i];
        }
        score_gradients<kQueryBlock>(s, dp, n, ws_.delta, p_.softcap > 0 ? tanh : nullptr);
        if (rng_.enabled)
          for (std::int64_t i = 0; i < std::int64_t(n) * kQueryBlock; ++i) s[i] *= ws_.z[i];
        // dV_j += P^T dO, dK_j += dS^T Q, dQ_i += dS K_j (dS read through the transposed tile).
        gemm(n, width, rows, {s, kQueryBlock, 1}, ws_.dout.data(), width, dv_j, width, true);
        gemm(n, width, rows, {dp, kQueryBlock, 1}, ws_.q.data(), width, dk_j, width, true);
        gemm(rows, width, n, {dp, 1, kQueryBlock}, k_j, width, dq, width, true);
      }
    }

    if (plan_.splits == 1) {
      const RowsView dq_view = rows_view(p_.dtype, p_.dq, task_.batch, seq_.offset_q, h);
      for (int m = 0; m < rows; ++m) store_row(dq_view, row0 + m, dq + std::int64_t(m) * width, head_dim, p_.scale);
    } else {  // every split writes its share of every row, zeros included
      std::copy_n(dq, std::size_t(rows) * width, shares_ + share_index(h, row0));
    }
  }

  // Q and dO of the block (row-major and transposed), D = rowsum(dO * O) and the LSE.
  void load_query_block(int h, int row0, int rows) {
    const int width = plan_.width, head_dim = p_.head_dim;
    const int b = task_.batch;
    const RowsView q = rows_view(p_.dtype, p_.q, b, seq_.offset_q, h);
    const RowsView dout = rows_view(p_.dtype, p_.dout, b, seq_.offset_q, h);
    const RowsView out = rows_view(p_.dtype, p_.out, b, seq_.offset_q, h);
    float* scratch = ws_.scratch.data();
    load_tile(q, row0, rows, kQueryBlock, head_dim, ws_.q.data(), width);
    load_tile_transposed(q, row0, rows, kQueryBlock, head_dim, query_prescale(p_), ws_.q_t.data(), scratch);
    load_tile(dout, row0, rows, kQueryBlock, head_dim, ws_.dout.data(), width);
    load_tile_transposed(dout, row0, rows, kQueryBlock, head_dim, 1.0f, ws_.dout_t.data(), scratch);
    for (int m = 0; m < kQueryBlock; ++m) {
      ws_.delta[m] = 0.0f;
      ws_.lse[m] = std::numeric_limits<float>::infinity();
    }
    for (int m = 0; m < rows; ++m) {
      convert_to_float(out.dtype, out.data, out.first + std::int64_t(row0 + m) * out.row_stride, head_dim, scratch);
      const float* dout_row = ws_.dout.data() + std::int64_t(m) * width;
      // The same chain of fused multiply-adds as the micro-kernel's dP = dO . V_j, so that a
      // row that sees a single key (O = V_j) gets dP - D = 0 exactly, as it should.
      float dot = 0.0f;
      for (int d = 0; d < head_dim; ++d) dot = std::fma(dout_row[d], scratch[d], dot);
      ws_.delta[m] = dot;
      const float lse = p_.lse.data[lse_index(p_.lse, b, seq_.offset_q, row0 + m, h)];
      if (lse != kNegInf) ws_.lse[m] = lse;
    }
  }

  std::int64_t share_index(int h, int row0) const {
    return ((std::int64_t(task_.split) * p_.heads_q + h) * plan_.total_q + plan_.share_row(p_, task_.batch, row0)) *
           plan_.width;
  }

  const detail::BackwardProblem& p_;
  const Plan& plan_;
  const DropoutStream& rng_;
  float* shares_;
  Task task_;
  Workspace& ws_;
  Sequence seq_;
  KeyRange keys_;
};

// dQ = scale * (sum of the splits' shares, in split order), for every query row.
void reduce_dq_shares(const detail::BackwardProblem& p, const Plan& plan, const float* shares) {
  struct Rows {
    int batch, head, row0;
  };
  std::vector<Rows> work;
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads_q; ++h)
      for (int row0 = 0; row0 < sequence(p, b).rows_q; row0 += kQueryBlock) work.push_back({b, h, row0});
  const std::int64_t split_stride = std::int64_t(p.heads_q) * plan.total_q * plan.width;
#pragma omp parallel
  {
    FloatBuffer sum(plan.width);
#pragma omp for schedule(static)
    for (std::size_t w = 0; w < work.size(); ++w) {
      const auto [b, h, row0] = work[w];
      const Sequence seq = sequence(p, b);
      const RowsView dq = rows_view(p.dtype, p.dq, b, seq.offset_q, h);
      for (int i = row0; i < std::min(row0 + kQueryBlock, seq.rows_q); ++i) {
        const float* share = shares + (std::int64_t(h) * plan.total_q + plan.share_row(p, b, i)) * plan.width;
        std::copy_n(share, plan.width, sum.data());
        for (int split = 1; split < plan.splits; ++split)
          for (int d = 0; d < plan.width; ++d) sum[d] += share[split * split_stride + d];
        store_row(dq, i, sum.data(), p.head_dim, p.scale);
      }
    }
  }
}

}  // namespace

void backward(const detail::BackwardProblem& p) {
  if (p.batch == 0) return;
  const Plan plan = make_plan(p);
  const DropoutStream rng(p);
  std::vector<Task> tasks;
  for (int b = 0; b < p.batch; ++b)
    for (int hk = 0; hk < p.heads_kv; ++hk)
      for (int split = 0; split < plan.splits; ++split) tasks.push_back({b, hk, split});
  // Uninitialized: the tasks write every element.
  std::unique_ptr<float[]> shares;
  if (plan.splits > 1) shares.reset(new float[std::size_t(plan.splits) * p.heads_q * plan.total_q * plan.width]);

#pragma omp parallel
  {
    Workspace ws(p.head_dim, plan.width);
#pragma omp for schedule(dynamic, 1)
    for (std::size_t t = 0; t < tasks.size(); ++t) BackwardTask(p, plan, rng, shares.get(), tasks[t], ws).run();
  }
  if (plan.splits > 1) reduce_dq_shares(p, plan, shares.get());
}

}  // namespace flashattn::cpu
