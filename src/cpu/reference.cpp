// Float64 reference: the definition of the function, in plain loops. Slow on purpose.
#include <cmath>
#include <limits>
#include <vector>

#include "common/mask.hpp"
#include "cpu/access.hpp"
#include "cpu/backend.hpp"

namespace flashattn::cpu {
namespace {

using detail::Problem;

// Scores of one query row against every key, as the forward defines them (masked: -inf).
// `tanh_out` receives tanh(raw * scale / softcap) for the backward (softcap only).
void scores_row(const Problem& p, int b, const Sequence& s, int h, int i, std::vector<double>& score,
                std::vector<double>& tanh_out) {
  const int hk = h / p.group_size();
  const auto range = detail::visible_keys(i, s.rows_q, s.rows_k, p.window_left, p.window_right);
  const std::int64_t qi = row_index(p.q, b, s.offset_q, i, h);
  score.assign(s.rows_k, -std::numeric_limits<double>::infinity());
  tanh_out.assign(s.rows_k, 0.0);
  for (int j = range.begin; j < range.end; ++j) {
    const std::int64_t kj = row_index(p.k, b, s.offset_k, j, hk);
    double dot = 0;
    for (int d = 0; d < p.head_dim; ++d) dot += double(load(p.dtype, p.q.data, qi + d)) * load(p.dtype, p.k.data, kj + d);
    double x = dot * p.scale;
    if (p.softcap > 0) {
      tanh_out[j] = std::tanh(x / p.softcap);
      x = p.softcap * tanh_out[j];
    }
    score[j] = x;
  }
}

// Softmax probabilities of one row; returns the LSE (-inf when the row sees no key).
double softmax_row(std::vector<double>& score) {
  double m = -std::numeric_limits<double>::infinity();
  for (double x : score) m = std::max(m, x);
  if (m == -std::numeric_limits<double>::infinity()) {
    for (double& x : score) x = 0;
    return m;
  }
  double sum = 0;
  for (double x : score) sum += std::exp(x - m);
  for (double& x : score) x = std::exp(x - m) / sum;
  return m + std::log(sum);
}

}  // namespace

void reference_forward(const detail::ForwardProblem& p) {
  std::vector<double> prob, tanh_unused, acc(p.head_dim);
  for (int b = 0; b < p.batch; ++b) {
    const Sequence s = sequence(p, b);
    for (int h = 0; h < p.heads_q; ++h) {
      const int hk = h / p.group_size();
      for (int i = 0; i < s.rows_q; ++i) {
        scores_row(p, b, s, h, i, prob, tanh_unused);
        const double lse = softmax_row(prob);
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int j = 0; j < s.rows_k; ++j) {
          if (prob[j] == 0) continue;
          const std::int64_t vj = row_index(p.v, b, s.offset_k, j, hk);
          for (int d = 0; d < p.head_dim; ++d) acc[d] += prob[j] * load(p.dtype, p.v.data, vj + d);
        }
        const std::int64_t oi = row_index(p.out, b, s.offset_q, i, h);
        for (int d = 0; d < p.head_dim; ++d) store(p.dtype, p.out.data, oi + d, float(acc[d]));
        if (p.lse.data) p.lse.data[lse_index(p.lse, b, s.offset_q, i, h)] = float(lse);
      }
    }
  }
}

void reference_backward(const detail::BackwardProblem& p) {
  const int D = p.head_dim;
  std::vector<double> prob, th, dp, o(D);
  for (int b = 0; b < p.batch; ++b) {
    const Sequence s = sequence(p, b);
    for (int hk = 0; hk < p.heads_kv; ++hk) {
      // dK and dV of this KV head sum over the query heads of its group.
      std::vector<double> dk(std::size_t(s.rows_k) * D, 0.0), dv(std::size_t(s.rows_k) * D, 0.0);
      for (int h = hk * p.group_size(); h < (hk + 1) * p.group_size(); ++h) {
        for (int i = 0; i < s.rows_q; ++i) {
          scores_row(p, b, s, h, i, prob, th);
          softmax_row(prob);
          const std::int64_t qi = row_index(p.q, b, s.offset_q, i, h);
          const std::int64_t doi = row_index(p.dout, b, s.offset_q, i, h);
          // O recomputed in float64, then D_i = dO_i . O_i.
          std::fill(o.begin(), o.end(), 0.0);
          dp.assign(s.rows_k, 0.0);
          for (int j = 0; j < s.rows_k; ++j) {
            if (prob[j] == 0) continue;
            const std::int64_t vj = row_index(p.v, b, s.offset_k, j, hk);
            double dot = 0;
            for (int d = 0; d < D; ++d) {
              const double vv = load(p.dtype, p.v.data, vj + d);
              o[d] += prob[j] * vv;
              dot += double(load(p.dtype, p.dout.data, doi + d)) * vv;
            }
            dp[j] = dot;
          }
          double delta = 0;
          for (int d = 0; d < D; ++d) delta += o[d] * load(p.dtype, p.dout.data, doi + d);
          std::vector<double> dq(D, 0.0);
          for (int j = 0; j < s.rows_k; ++j) {
            if (prob[j] == 0) continue;
            double ds = prob[j] * (dp[j] - delta);
            if (p.softcap > 0) ds *= 1.0 - th[j] * th[j];
            ds *= p.scale;
            const std::int64_t kj = row_index(p.k, b, s.offset_k, j, hk);
            for (int d = 0; d < D; ++d) {
              dq[d] += ds * load(p.dtype, p.k.data, kj + d);
              dk[std::size_t(j) * D + d] += ds * load(p.dtype, p.q.data, qi + d);
              dv[std::size_t(j) * D + d] += prob[j] * load(p.dtype, p.dout.data, doi + d);
            }
          }
          const std::int64_t dqi = row_index(p.dq, b, s.offset_q, i, h);
          for (int d = 0; d < D; ++d) store(p.dtype, p.dq.data, dqi + d, float(dq[d]));
        }
      }
      for (int j = 0; j < s.rows_k; ++j) {
        const std::int64_t dkj = row_index(p.dk, b, s.offset_k, j, hk);
        const std::int64_t dvj = row_index(p.dv, b, s.offset_k, j, hk);
        for (int d = 0; d < D; ++d) {
          store(p.dtype, p.dk.data, dkj + d, float(dk[std::size_t(j) * D + d]));
          store(p.dtype, p.dv.data, dvj + d, float(dv[std::size_t(j) * D + d]));
        }
      }
    }
  }
}

}  // namespace flashattn::cpu
