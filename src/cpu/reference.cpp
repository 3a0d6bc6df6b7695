// Float64 reference: the definition of the function, in plain loops. Slow on purpose; only
// the independent (batch, head) pairs run in parallel.
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "common/mask.hpp"
#include "cpu/access.hpp"
#include "cpu/backend.hpp"
#include "cpu/dropout.hpp"

namespace flashattn::cpu {
namespace {

using detail::Problem;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// x rounded to `dtype` when a same-precision baseline is asked for; x itself otherwise.
double rounded(double x, std::optional<DType> dtype) {
  if (!dtype) return x;
  float f = float(x);
  if (*dtype == DType::bf16) return detail::bf16_to_float(detail::float_to_bf16(f));
  if (*dtype == DType::f16) return detail::half_to_float(detail::float_to_half(f));
  return f;
}

// Scores of one query row against every key, as the forward defines them (masked: -inf), with
// the ALiBi bias when slopes are given.
// `tanh_out` receives tanh(raw * scale / softcap) for the backward (softcap only).
// The same-precision baseline (round_to set) accumulates the dot products in float.
void scores_row(const Problem& p, int b, const Sequence& s, int h, int i, std::vector<double>& score,
                std::vector<double>& tanh_out, std::optional<DType> round_to) {
  const int hk = h / p.group_size();
  const auto range = detail::visible_keys(i, s.rows_q, s.rows_k, p.window_left, p.window_right);
  const std::int64_t qi = row_index(p.q, b, s.offset_q, i, h);
  score.assign(s.rows_k, kNegInf);
  tanh_out.assign(s.rows_k, 0.0);
  for (int j = range.begin; j < range.end; ++j) {
    const std::int64_t kj = kv_index(p, p.k, b, s, j, hk);
    double dot = 0;
    if (round_to) {  // the baseline accumulates in float, as tensor cores and fp32 code do
      float acc = 0;
      for (int d = 0; d < p.head_dim; ++d) acc += load(p.dtype, p.q.data, qi + d) * load(p.dtype, p.k.data, kj + d);
      dot = acc;
    } else {
      for (int d = 0; d < p.head_dim; ++d) dot += double(load(p.dtype, p.q.data, qi + d)) * load(p.dtype, p.k.data, kj + d);
    }
    double x = dot * p.scale;
    if (p.softcap > 0) {
      tanh_out[j] = std::tanh(x / p.softcap);
      x = p.softcap * tanh_out[j];
    }
    if (p.alibi.enabled())  // common/alibi.hpp: after scale and softcap
      x -= double(p.alibi.slope(b, h)) * std::abs(double(i) + s.rows_k - s.rows_q - j);
    score[j] = x;
  }
}

// Softmax probabilities of one row, in place; returns the LSE (-inf when the row sees no key).
double softmax_row(std::vector<double>& score, std::optional<DType> round_to) {
  double m = kNegInf;
  for (double x : score) m = std::max(m, x);
  if (m == kNegInf) {
    for (double& x : score) x = 0;
    return m;
  }
  double sum = 0;
  for (double x : score) sum += std::exp(x - m);
  for (double& x : score) x = rounded(std::exp(x - m) / sum, round_to);
  return m + std::log(sum);
}

// The backward's P: the baseline recomputes it as exp(s - LSE) from an LSE stored in float,
// as the FlashAttention backward does; the exact reference normalizes directly.
void backward_probabilities(std::vector<double>& score, std::optional<DType> round_to) {
  if (!round_to) {
    softmax_row(score, round_to);
    return;
  }
  std::vector<double> exact = score;
  const float stored_lse = float(softmax_row(exact, std::nullopt));
  for (double& x : score) x = x == kNegInf ? 0.0 : rounded(std::exp(x - double(stored_lse)), round_to);
}

// Dropout's keep factor of every key of query row i of (b, h): 1 / (1 - p) or 0 (all 1 without
// dropout), one element at a time from the definition in common/philox.hpp.
void dropout_row(const Problem& p, const DropoutStream& rng, int b, int h, int i, int rows_k, std::vector<double>& z) {
  z.assign(rows_k, 1.0);
  if (!rng.enabled) return;
  for (int j = 0; j < rows_k; ++j)
    z[j] = detail::dropout_value(rng.seed, rng.offset, b, p.heads_q, h, i, j) >= rng.threshold
               ? double(1.0 / (1.0 - double(p.dropout.p)))
               : 0.0;
}

// Runs fn(b, h) for every (batch, head) pair, in parallel.
template <class Fn>
void for_each_batch_head(int batch, int heads, Fn&& fn) {
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h) fn(b, h);
}

}  // namespace

void reference_forward(const detail::ForwardProblem& p, std::optional<DType> round_to) {
  const DropoutStream rng(p);
  for_each_batch_head(p.batch, p.heads_q, [&](int b, int h) {
    const Sequence s = sequence(p, b);
    const int hk = h / p.group_size();
    std::vector<double> prob, tanh_unused, z, acc(p.head_dim);
    for (int i = 0; i < s.rows_q; ++i) {
      scores_row(p, b, s, h, i, prob, tanh_unused, round_to);
      const double lse = softmax_row(prob, round_to);  // of the undropped scores
      dropout_row(p, rng, b, h, i, s.rows_k, z);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int j = 0; j < s.rows_k; ++j) {
        if (prob[j] == 0 || z[j] == 0) continue;
        const std::int64_t vj = kv_index(p, p.v, b, s, j, hk);
        for (int d = 0; d < p.head_dim; ++d) acc[d] += prob[j] * z[j] * load(p.dtype, p.v.data, vj + d);
      }
      const std::int64_t oi = row_index(p.out, b, s.offset_q, i, h);
      for (int d = 0; d < p.head_dim; ++d) store(p.dtype, p.out.data, oi + d, float(rounded(acc[d], round_to)));
      if (p.lse.data) p.lse.data[lse_index(p.lse, b, s.offset_q, i, h)] = float(lse);
    }
  });
}

void reference_backward(const detail::BackwardProblem& p, std::optional<DType> round_to) {
  const int D = p.head_dim;
  const DropoutStream rng(p);
  // With dropout (keep factors z = mask / (1 - p)), O = (P z) V, so dV = (P z)^T dO, the
  // gradient of P is dP = (dO V^T) z, and the softmax's backward gives
  // dS = P (dP - rowsum(P dP)) = P ((dO V^T) z - D) with D = rowsum(P z (dO V^T)) = dO . O.
  // One task per (batch, KV head): dK and dV of a KV head sum over the query heads of its group.
  for_each_batch_head(p.batch, p.heads_kv, [&](int b, int hk) {
    const Sequence s = sequence(p, b);
    std::vector<double> prob, th, dp, z, o(D), dq(D);
    std::vector<double> dk(std::size_t(s.rows_k) * D, 0.0), dv(std::size_t(s.rows_k) * D, 0.0);
    for (int h = hk * p.group_size(); h < (hk + 1) * p.group_size(); ++h) {
      for (int i = 0; i < s.rows_q; ++i) {
        scores_row(p, b, s, h, i, prob, th, round_to);
        backward_probabilities(prob, round_to);
        dropout_row(p, rng, b, h, i, s.rows_k, z);
        const std::int64_t qi = row_index(p.q, b, s.offset_q, i, h);
        const std::int64_t doi = row_index(p.dout, b, s.offset_q, i, h);
        // O recomputed, dP_j = dO . V_j, then D_i = dO_i . O_i.
        std::fill(o.begin(), o.end(), 0.0);
        dp.assign(s.rows_k, 0.0);
        for (int j = 0; j < s.rows_k; ++j) {
          if (prob[j] == 0) continue;
          const std::int64_t vj = kv_index(p, p.v, b, s, j, hk);
          double dot = 0;
          float dot_f = 0;  // the baseline's float accumulation
          for (int d = 0; d < D; ++d) {
            const double vv = load(p.dtype, p.v.data, vj + d);
            o[d] += prob[j] * z[j] * vv;
            dot += double(load(p.dtype, p.dout.data, doi + d)) * vv;
            dot_f += load(p.dtype, p.dout.data, doi + d) * float(vv);
          }
          dp[j] = round_to ? rounded(dot_f, round_to) : dot;
        }
        double delta = 0;
        for (int d = 0; d < D; ++d) delta += rounded(o[d], round_to) * load(p.dtype, p.dout.data, doi + d);
        std::fill(dq.begin(), dq.end(), 0.0);
        for (int j = 0; j < s.rows_k; ++j) {
          if (prob[j] == 0) continue;
          double ds = prob[j] * (dp[j] * z[j] - delta);
          if (p.softcap > 0) ds *= 1.0 - th[j] * th[j];
          ds = rounded(ds, round_to) * p.scale;
          const std::int64_t kj = kv_index(p, p.k, b, s, j, hk);
          for (int d = 0; d < D; ++d) {
            dq[d] += ds * load(p.dtype, p.k.data, kj + d);
            dk[std::size_t(j) * D + d] += ds * load(p.dtype, p.q.data, qi + d);
            dv[std::size_t(j) * D + d] += prob[j] * z[j] * load(p.dtype, p.dout.data, doi + d);
          }
        }
        const std::int64_t dqi = row_index(p.dq, b, s.offset_q, i, h);
        for (int d = 0; d < D; ++d) store(p.dtype, p.dq.data, dqi + d, float(rounded(dq[d], round_to)));
      }
    }
    for (int j = 0; j < s.rows_k; ++j) {
      const std::int64_t dkj = row_index(p.dk, b, s.offset_k, j, hk);
      const std::int64_t dvj = row_index(p.dv, b, s.offset_k, j, hk);
      for (int d = 0; d < D; ++d) {
        store(p.dtype, p.dk.data, dkj + d, float(rounded(dk[std::size_t(j) * D + d], round_to)));
        store(p.dtype, p.dv.data, dvj + d, float(rounded(dv[std::size_t(j) * D + d], round_to)));
      }
    }
  });
}

}  // namespace flashattn::cpu
