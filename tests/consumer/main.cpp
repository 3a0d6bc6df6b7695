// One small attention call on the CPU backend through an installed flashattn, checked against
// softmax(q k^T / sqrt(d)) v computed here in double precision, plus one rejected argument and
// the library's version and backends against the package's. Exits non-zero on any mismatch.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include <flashattn/flashattn.hpp>

int main() {
  // q: (batch 1, 5 queries, 2 heads, head dim 8); k, v: (1, 7 keys, 1 head, 8): GQA 2:1.
  const int nq = 5, nk = 7, hq = 2, hk = 1, d = 8;
  std::vector<float> q(nq * hq * d), k(nk * hk * d), v(nk * hk * d), out(q.size(), NAN);
  std::vector<float> lse(hq * nq, NAN);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.7 * i + 0.1);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = std::cos(1.3 * i);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.4 * i + 2.0);

  using flashattn::DType;
  using flashattn::TensorView;
  flashattn::ForwardArgs args;
  args.q = TensorView::contiguous(q.data(), DType::f32, {1, nq, hq, d});
  args.k = TensorView::contiguous(k.data(), DType::f32, {1, nk, hk, d});
  args.v = TensorView::contiguous(v.data(), DType::f32, {1, nk, hk, d});
  args.out = TensorView::contiguous(out.data(), DType::f32, {1, nq, hq, d});
  args.lse = TensorView::contiguous(lse.data(), DType::f32, {1, hq, nq});
  args.causal = true;  // bottom-right aligned: query i sees keys j <= i + nk - nq
  flashattn::forward(args);

  double worst = 0.0;
  for (int h = 0; h < hq; ++h) {
    for (int i = 0; i < nq; ++i) {
      const int last_key = i + nk - nq;
      std::vector<double> p(last_key + 1);
      double row_max = -INFINITY, sum = 0.0;
      for (int j = 0; j <= last_key; ++j) {
        double s = 0.0;
        for (int c = 0; c < d; ++c) s += double(q[(i * hq + h) * d + c]) * k[j * d + c];
        p[j] = s / std::sqrt(double(d));
        row_max = std::fmax(row_max, p[j]);
      }
      for (double& x : p) sum += (x = std::exp(x - row_max));
      for (int c = 0; c < d; ++c) {
        double o = 0.0;
        for (int j = 0; j <= last_key; ++j) o += p[j] / sum * v[j * d + c];
        const float got = out[(i * hq + h) * d + c];
        if (!std::isfinite(got)) {
          std::printf("consumer: out[%d, %d, %d] = %f is not finite\n", i, h, c, got);
          return 1;
        }
        worst = std::fmax(worst, std::fabs(got - o));
      }
      worst = std::fmax(worst, std::fabs(lse[h * nq + i] - (row_max + std::log(sum))));
    }
  }

  // Errors cross the library boundary as flashattn::Error, naming the argument.
  bool threw = false;
  args.out = TensorView::contiguous(out.data(), DType::f32, {1, nq, hq, d + 1});
  try {
    flashattn::forward(args);
  } catch (const flashattn::Error& e) {
    threw = e.argument().rfind("out", 0) == 0;  // "out.shape"
    if (!threw) std::printf("consumer: the error names '%s', not out\n", e.argument().c_str());
  }

  // The library is the one the package described: its version, and the CUDA backend or not.
  const bool same_version = std::strcmp(flashattn::version(), FLASHATTN_PACKAGE_VERSION) == 0;
  const bool same_backends = flashattn::built_with_cuda() == bool(FLASHATTN_PACKAGE_WITH_CUDA);
  std::printf("consumer: flashattn %s (package %s), CUDA backend %s (package %s), "
              "max |error| %.2e, bad shape rejected: %s\n",
              flashattn::version(), FLASHATTN_PACKAGE_VERSION,
              flashattn::built_with_cuda() ? "on" : "off",
              FLASHATTN_PACKAGE_WITH_CUDA ? "on" : "off", worst, threw ? "yes" : "no");
  return worst < 1e-5 && threw && same_version && same_backends ? 0 : 1;
}
