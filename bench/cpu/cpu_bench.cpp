// Times the CPU backend's forward and backward, fp32 and bf16, on all OpenMP threads, at the
// shapes listed in a file (shapes.txt: "batch heads seqlen head_dim causal" per line, the
// same file bench_torch.py reads). Prints one JSON object per line and writes them all to the
// output file. FLOPs as the FlashAttention papers count them (backward = 2.5 x forward).
// Usage: cpu_bench shapes.txt out.json
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <functional>
#include <string>
#include <vector>

#include "attention_data.hpp"

using namespace flashattn;

namespace {

// Median of repeated runs after one warm-up: at least 5 runs and about 0.5 s.
double median_ms(const std::function<void()>& fn) {
  fn();
  std::vector<double> ms;
  double total = 0;
  while (ms.size() < 5 || (total < 500 && ms.size() < 50)) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ms.push_back(t);
    total += t;
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct BenchShape {
  int batch, heads, seqlen, head_dim;
  bool causal;
};

std::vector<BenchShape> read_shapes(const char* path) {
  std::vector<BenchShape> shapes;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    BenchShape s{};
    int causal = 0;
    if (fields >> s.batch >> s.heads >> s.seqlen >> s.head_dim >> causal) {
      s.causal = causal != 0;
      shapes.push_back(s);
    }
  }
  return shapes;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: cpu_bench shapes.txt [out.json]\n");
    return 2;
  }
  std::FILE* json = argc > 2 ? std::fopen(argv[2], "w") : nullptr;
  if (json) std::fprintf(json, "[\n");
  bool first = true;
  for (const BenchShape& b : read_shapes(argv[1])) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      bench::Shape s;
      s.batch = b.batch, s.heads_q = s.heads_kv = b.heads, s.seqlen_q = s.seqlen_k = b.seqlen;
      s.head_dim = b.head_dim, s.causal = b.causal;
      bench::AttentionData data(s, dtype, 1234);
      ForwardArgs fa = data.forward_args();
      BackwardArgs ba = data.backward_args();
      const double fwd = median_ms([&] { forward(fa); });
      const double bwd = median_ms([&] { backward(ba); });
      const double flops = bench::forward_flops(s);
      char line[512];
      std::snprintf(line, sizeof line,
                    "{\"impl\": \"flashattn\", \"dtype\": \"%s\", \"b\": %d, \"h\": %d, \"n\": %d, \"d\": %d, "
                    "\"causal\": %s, \"threads\": %d, \"fwd_ms\": %.3f, \"fwd_gflops\": %.1f, \"bwd_ms\": %.3f, "
                    "\"bwd_gflops\": %.1f}",
                    to_string(dtype), b.batch, b.heads, b.seqlen, b.head_dim, b.causal ? "true" : "false",
                    omp_get_max_threads(), fwd, flops / fwd / 1e6, bwd, 2.5 * flops / bwd / 1e6);
      std::printf("%s\n", line);
      std::fflush(stdout);
      if (json) std::fprintf(json, "%s %s", first ? "" : ",\n", line);
      first = false;
    }
  }
  if (json) std::fprintf(json, "\n]\n"), std::fclose(json);
}
