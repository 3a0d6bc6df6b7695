// The CPU forward: tiled online softmax (FlashAttention-2's forward on the CPU).
//
// One task is one block of kQueryBlock query rows of one head; tasks run in parallel
// (OpenMP, dynamic schedule, longest first). A task keeps its query block transposed and
// pre-scaled in fp32, streams the key blocks its rows may see through fp32 tiles, and per key
// block computes the transposed score tile S^T = K Q^T, soft-caps it, adds the ALiBi bias
// (common/alibi.hpp), masks it, updates the running row max and sum, rescales its output
// accumulator and adds P V. Extra memory is a few tiles per thread; every output row is
// computed by one task in a fixed order, so the result does not depend on the thread count.
#include <algorithm>
#include <vector>

#include "cpu/backend.hpp"
#include "cpu/dropout.hpp"
#include "cpu/gemm.hpp"
#include "cpu/score_tile.hpp"
#include "cpu/tile.hpp"

namespace flashattn::cpu {
namespace {

constexpr int kQueryBlock = 64;  // query rows per task: the vector dimension of the score tile
constexpr int kKeyBlock = 128;   // keys per step
static_assert(kQueryBlock % kMicroCols == 0);

struct Task {
  int batch, head, block;
};

// One thread's tiles.
struct Workspace {
  explicit Workspace(int head_dim)
      : width(round_up(head_dim, simd::kLanes)),
        q_t(std::size_t(head_dim) * kQueryBlock),
        k(std::size_t(kKeyBlock) * head_dim),
        v(std::size_t(kKeyBlock) * width),
        s(std::size_t(kKeyBlock) * kQueryBlock),
        o(std::size_t(kQueryBlock) * width),
        scratch(head_dim) {}

  void reserve_dropout() { z.resize(std::size_t(kKeyBlock) * kQueryBlock); }

  int width;           // head_dim rounded up to whole vectors
  FloatBuffer q_t;     // head_dim x kQueryBlock: the query block, transposed and pre-scaled
  FloatBuffer k;       // kKeyBlock x head_dim
  FloatBuffer v;       // kKeyBlock x width
  FloatBuffer s;       // kKeyBlock x kQueryBlock: scores, then probabilities
  FloatBuffer o;       // kQueryBlock x width: unnormalized output
  FloatBuffer scratch;  // one row
  FloatBuffer z;        // kKeyBlock x kQueryBlock: dropout's keep factors (dropout only)
  OnlineSoftmax<kQueryBlock> softmax;
};

void forward_block(const detail::ForwardProblem& p, const DropoutStream& rng, const Task& task, Workspace& ws) {
  const Sequence seq = sequence(p, task.batch);
  const int head_dim = p.head_dim, width = ws.width;
  const int kv_head = task.head / p.group_size();
  const int row0 = task.block * kQueryBlock;
  const int rows = std::min(kQueryBlock, seq.rows_q - row0);
  const RowsView q = rows_view(p.dtype, p.q, task.batch, seq.offset_q, task.head);
  const RowsView k = kv_rows_view(p, p.k, task.batch, seq, kv_head);
  const RowsView v = kv_rows_view(p, p.v, task.batch, seq, kv_head);
  const RowsView out = rows_view(p.dtype, p.out, task.batch, seq.offset_q, task.head);
  const QueryBlockKeys<kQueryBlock> keys(p, seq, row0, rows);

  load_tile_transposed(q, row0, rows, kQueryBlock, head_dim, query_prescale(p), ws.q_t.data(),
                       ws.scratch.data());
  std::fill(ws.o.begin(), ws.o.end(), 0.0f);
  ws.softmax.reset();

  for (int key0 = keys.key_begin; key0 < keys.key_end; key0 += kKeyBlock) {
    const int n = std::min(kKeyBlock, keys.key_end - key0);
    // The product only broadcasts elements of K: fp32 keys are read in place, others converted.
    StridedMatrix k_rows{ws.k.data(), head_dim, 1};
    if (p.dtype == DType::f32 && k.contiguous())
      k_rows = {static_cast<const float*>(k.data) + k.first + key0 * k.row_stride, k.row_stride, 1};
    else
      load_tile(k, key0, n, n, head_dim, ws.k.data(), head_dim);
    load_tile(v, key0, n, n, head_dim, ws.v.data(), width);
    gemm(n, kQueryBlock, head_dim, k_rows, ws.q_t.data(), kQueryBlock, ws.s.data(),
         kQueryBlock, /*accumulate=*/false);
    if (p.softcap > 0) softcap_scores(ws.s.data(), n * kQueryBlock, p.softcap, nullptr);
    if (p.alibi.enabled())
      alibi_scores<kQueryBlock>(ws.s.data(), n, key0, row0, seq.rows_k - seq.rows_q,
                                p.alibi.slope(task.batch, task.head));
    if (!keys.sees_all(key0, key0 + n)) mask_scores(ws.s.data(), n, key0, keys);
    ws.softmax.update(ws.s.data(), n);
    if (rng.enabled) {  // dropout after the softmax, for P V only: the row sums stay undropped
      rng.factors<kQueryBlock>(task.batch, task.head, row0, rows, key0, n, ws.z.data());
      for (std::int64_t i = 0; i < std::int64_t(n) * kQueryBlock; ++i) ws.s[i] *= ws.z[i];
    }
    for (int m = 0; m < rows; ++m) {
      float* o_row = ws.o.data() + std::int64_t(m) * width;
      const float factor = ws.softmax.rescale[m];
      for (int d = 0; d < width; ++d) o_row[d] *= factor;
    }
    // O += P V, with P read from the transposed tile: P(m, key) = s[key * kQueryBlock + m].
    gemm(rows, width, n, {ws.s.data(), 1, kQueryBlock}, ws.v.data(), width, ws.o.data(), width,
         /*accumulate=*/true);
  }

  for (int m = 0; m < rows; ++m)
    store_row(out, row0 + m, ws.o.data() + std::int64_t(m) * width, head_dim, ws.softmax.normalizer(m));
  if (p.lse.data)
    for (int m = 0; m < rows; ++m)
      p.lse.data[lse_index(p.lse, task.batch, seq.offset_q, row0 + m, task.head)] = ws.softmax.lse(m);
}

}  // namespace

void forward(const detail::ForwardProblem& p) {
  std::vector<Task> tasks;
  for (int b = 0; b < p.batch; ++b) {
    const int blocks = (sequence(p, b).rows_q + kQueryBlock - 1) / kQueryBlock;
    // Last blocks first: under a causal mask they see the most keys.
    for (int block = blocks - 1; block >= 0; --block)
      for (int h = 0; h < p.heads_q; ++h) tasks.push_back({b, h, block});
  }
  if (tasks.empty()) return;
  const DropoutStream rng(p);
#pragma omp parallel
  {
    Workspace ws(p.head_dim);
    if (rng.enabled) ws.reserve_dropout();
#pragma omp for schedule(dynamic, 1)
    for (std::size_t i = 0; i < tasks.size(); ++i) forward_block(p, rng, tasks[i], ws);
  }
}

}  // namespace flashattn::cpu
