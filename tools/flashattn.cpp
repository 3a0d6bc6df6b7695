// The `flashattn` command line: run one workload, sweep a benchmark, print build info.
//
//   flashattn run --batch B --heads H [--heads-kv HKV] --seqlen N [--seqlen-k NK] --headdim D
//                 [--causal] [--window L,R] [--softcap C] [--alibi] [--dropout P]
//                 [--dtype f16|bf16|f32|e4m3 [--fp8-blocks]]
//                 [--backend auto|cpu|cuda] [--backward [--deterministic]] [--check-rows R] [--seed S]
//                 [--kv-cache [--page-size P] [--append N] [--rotary-dim R]]
//   flashattn bench [--backend auto|cpu|cuda] [--dtype ...] [--suite train|decode|cpu] [--quick]
//                   [--backward [--deterministic]] [--json FILE [--plot]]
//   flashattn info
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "flashattn/flashattn.hpp"
#include "timing.hpp"
#include "kv_workload.hpp"
#include "workload.hpp"

namespace flashattn::tools {
namespace {

// --name value / --flag arguments.
class Args {
 public:
  Args(int argc, char** argv, int first, const std::vector<std::string>& flags) {
    for (int i = first; i < argc; ++i) {
      std::string a = argv[i];
      if (a.rfind("--", 0) != 0) throw std::invalid_argument("unexpected argument '" + a + "'");
      a = a.substr(2);
      if (std::find(flags.begin(), flags.end(), a) != flags.end()) {
        values_[a] = "1";
      } else {
        if (i + 1 >= argc) throw std::invalid_argument("--" + a + " needs a value");
        values_[a] = argv[++i];
      }
    }
  }
  bool has(const std::string& k) const { return values_.count(k) > 0; }
  std::string get(const std::string& k, const std::string& def) const {
    auto it = values_.find(k);
    return it == values_.end() ? def : it->second;
  }
  int integer(const std::string& k, int def) const {
    if (!has(k)) return def;
    char* end = nullptr;
    const long v = std::strtol(values_.at(k).c_str(), &end, 10);
    if (*end) throw std::invalid_argument("--" + k + " expects an integer, got '" + values_.at(k) + "'");
    return int(v);
  }
  void reject_unknown(const std::vector<std::string>& known) const {
    for (auto& [k, v] : values_)
      if (std::find(known.begin(), known.end(), k) == known.end())
        throw std::invalid_argument("unknown option --" + k);
  }

 private:
  std::map<std::string, std::string> values_;
};

DType parse_dtype(const std::string& s) {
  if (s == "f16" || s == "fp16") return DType::f16;
  if (s == "bf16") return DType::bf16;
  if (s == "f32" || s == "fp32") return DType::f32;
  if (s == "e4m3" || s == "fp8") return DType::e4m3;  // the FP8 forward (Hopper): bf16 output, descale 1
  throw std::invalid_argument("--dtype expects f16, bf16, f32 or e4m3, got '" + s + "'");
}

DeviceKind parse_backend(const std::string& s) {
  if (s == "auto") return cuda_available() ? DeviceKind::cuda : DeviceKind::cpu;
  if (s == "cpu") return DeviceKind::cpu;
  if (s == "cuda") {
    if (!built_with_cuda()) throw std::invalid_argument("--backend cuda: this build has no CUDA backend");
    if (!cuda_available()) throw std::invalid_argument("--backend cuda: no CUDA device is available");
    return DeviceKind::cuda;
  }
  throw std::invalid_argument("--backend expects auto, cpu or cuda, got '" + s + "'");
}

std::string megabytes(std::size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", double(bytes) / (1 << 20));
  return buf;
}

// `run --kv-cache`: flash_attn_with_kvcache's call on a cache of --seqlen-k rows per sequence
// (paged with --page-size), --seqlen queries, --append rows written (and rotated) per call.
int run_kv_cache(const Args& args, const Shape& s, std::uint64_t seed) {
  if (args.has("backward")) throw std::invalid_argument("--kv-cache has no backward (inference only)");
  KvOptions kv;
  kv.page_size = args.integer("page-size", 0);
  kv.append = args.integer("append", 0);
  kv.rotary_dim = args.integer("rotary-dim", 0);
  std::printf("flashattn run --kv-cache: %s, %s, append %d, rotary_dim %d on %s\n", s.describe().c_str(),
              kv.page_size ? ("pages of " + std::to_string(kv.page_size)).c_str() : "contiguous cache", kv.append,
              kv.rotary_dim, to_string(s.device));
  KvWorkload w(s, kv, seed);
  host::reset_device_workspace_high_water();
  const host::Timing fwd = host::time_runs(s.device, [&] { w.forward(); });
  std::printf("forward : %9.3f ms  %8.3f TB/s of K/V  (median of %d)\n", fwd.median_ms,
              w.kv_bytes() / fwd.median_ms / 1e9, fwd.iterations);
  if (s.device == DeviceKind::cuda)
    std::printf("memory  : tensors %s, workspace peak %s\n", megabytes(w.tensor_bytes()).c_str(),
                megabytes(host::device_workspace_high_water()).c_str());
  if (args.integer("check-rows", 16) == 0) return 0;
  w.forward();
  const RowCheck check = w.check();
  std::printf("check   : %d rows vs float64 reference, max relative error %.2e (tolerance %.0e) %s\n", check.rows,
              check.max_error, check.tolerance, check.ok() ? "ok" : "FAILED");
  return check.ok() ? 0 : 1;
}

int run_command(int argc, char** argv) {
  const std::vector<std::string> flags = {"causal", "backward", "deterministic", "kv-cache", "alibi", "fp8-blocks"};
  Args args(argc, argv, 2, flags);
  args.reject_unknown({"batch", "heads", "heads-kv", "seqlen", "seqlen-k", "headdim", "causal", "window", "softcap",
                       "alibi", "dropout", "dtype", "backend", "backward", "deterministic", "check-rows", "seed", "kv-cache",
                       "page-size", "append", "rotary-dim", "fp8-blocks"});
  if (!args.has("kv-cache") && (args.has("page-size") || args.has("append") || args.has("rotary-dim")))
    throw std::invalid_argument("--page-size, --append and --rotary-dim need --kv-cache");
  Shape s;
  s.batch = args.integer("batch", 2);
  s.heads = args.integer("heads", 16);
  s.heads_kv = args.integer("heads-kv", 0);
  s.seqlen = args.integer("seqlen", 1024);
  s.seqlen_k = args.integer("seqlen-k", 0);
  s.head_dim = args.integer("headdim", 128);
  s.causal = args.has("causal");
  if (args.has("window")) {
    const std::string w = args.get("window", "");
    const auto comma = w.find(',');
    if (comma == std::string::npos) throw std::invalid_argument("--window expects L,R (e.g. 256,0), got '" + w + "'");
    s.window_left = std::stoi(w.substr(0, comma));
    s.window_right = std::stoi(w.substr(comma + 1));
  }
  s.softcap = std::stof(args.get("softcap", "0"));
  s.dropout = std::stof(args.get("dropout", "0"));
  s.alibi = args.has("alibi");
  s.deterministic = args.has("deterministic");
  if (s.deterministic && !args.has("backward")) throw std::invalid_argument("--deterministic needs --backward");
  s.device = parse_backend(args.get("backend", "auto"));
  s.dtype = parse_dtype(args.get("dtype", s.device == DeviceKind::cuda ? "bf16" : "f32"));
  s.fp8_blocks = args.has("fp8-blocks");
  if (s.fp8_blocks && s.dtype != DType::e4m3) throw std::invalid_argument("--fp8-blocks needs --dtype e4m3");
  const bool with_backward = args.has("backward");
  const int check_rows = args.integer("check-rows", 16);
  const std::uint64_t seed = args.has("seed") ? std::uint64_t(args.integer("seed", 0)) : std::random_device{}();

  if (args.has("kv-cache")) return run_kv_cache(args, s, seed);
  std::printf("flashattn run: %s on %s\n", s.describe().c_str(), to_string(s.device));
  Workload w(s, seed);
  host::reset_device_workspace_high_water();
  const host::Timing fwd = host::time_runs(s.device, [&] { w.forward(); });
  std::printf("forward : %9.3f ms  %8.2f TFLOP/s  (median of %d)\n", fwd.median_ms,
              forward_flops(s) / fwd.median_ms / 1e9, fwd.iterations);
  if (with_backward) {
    const host::Timing bwd = host::time_runs(s.device, [&] { w.backward(); });
    std::printf("backward: %9.3f ms  %8.2f TFLOP/s  (median of %d)\n", bwd.median_ms,
                backward_flops(s) / bwd.median_ms / 1e9, bwd.iterations);
  }
  if (s.device == DeviceKind::cuda)
    std::printf("memory  : tensors %s, workspace peak %s\n", megabytes(w.tensor_bytes()).c_str(),
                megabytes(host::device_workspace_high_water()).c_str());
  else
    std::printf("memory  : tensors %s, process peak %s\n", megabytes(w.tensor_bytes()).c_str(),
                megabytes(host::host_peak_rss()).c_str());
  w.forward();
  const RowCheck check = w.check_forward_rows(check_rows);
  std::printf("check   : %d sampled rows vs float64 reference, max relative error %.2e (tolerance %.0e) %s\n",
              check.rows, check.max_error, check.tolerance, check.ok() ? "ok" : "FAILED");
  return check.ok() ? 0 : 1;
}

// The benchmark suites: `train` (ANCHORS.md: 16k tokens in total, hidden 2048), `decode`
// (one query token against a long KV cache, GQA 32:8) and `cpu` (ANCHORS.md's CPU line).
std::vector<Shape> bench_shapes(const std::string& suite, DeviceKind device, DType dtype, bool quick) {
  std::vector<Shape> shapes;
  auto shape = [&](int b, int h, int hkv, int n, int nk, int d, bool causal) {
    Shape s;
    s.device = device;
    s.dtype = dtype;
    s.batch = b;
    s.heads = h;
    s.heads_kv = hkv;
    s.seqlen = n;
    s.seqlen_k = nk;
    s.head_dim = d;
    s.causal = causal;
    shapes.push_back(s);
  };
  if (suite == "train") {
    const std::vector<int> dims = quick ? std::vector<int>{128} : std::vector<int>{64, 128, 256};
    const std::vector<int> lens =
        quick ? std::vector<int>{1024, 4096} : std::vector<int>{512, 1024, 2048, 4096, 8192, 16384};
    for (int d : dims)
      for (int n : lens)
        for (bool causal : {false, true}) shape(16384 / n, 2048 / d, 0, n, 0, d, causal);
  } else if (suite == "decode") {
    const std::vector<int> lens = quick ? std::vector<int>{4096} : std::vector<int>{4096, 16384, 65536, 131072};
    for (int nk : lens) shape(8, 32, 8, 1, nk, 128, false);
  } else if (suite == "cpu") {
    const std::vector<int> lens = quick ? std::vector<int>{512} : std::vector<int>{1024, 2048};
    for (int d : {64, 128})
      for (int n : lens)
        for (bool causal : {false, true}) shape(2, 8, 0, n, 0, d, causal);
  } else {
    throw std::invalid_argument("--suite expects train, decode or cpu, got '" + suite + "'");
  }
  return shapes;
}

void progress(std::size_t done, std::size_t total, const std::string& what) {
  const int width = 30, filled = int(width * done / std::max<std::size_t>(total, 1));
  std::fprintf(stderr, "\r[%s%s] %zu/%zu %-50s", std::string(filled, '#').c_str(),
               std::string(width - filled, '.').c_str(), done, total, what.c_str());
  if (done == total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

// --plot: the JSON's plot (a PNG beside it) is drawn by Python's matplotlib, through
// bench/plot.py of the source tree this binary was built from where it is still there (it loads
// python/src/flashattn/plot.py by path: the Python package need not be installed), else through
// the installed Python package's `python3 -m flashattn.plot`.
std::string shell_quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The command that plots, minus the JSON's path; empty (and a message) where python3 with
// matplotlib (and, without the source tree, the flashattn package) is not there.
std::string plot_command() {
  const std::filesystem::path script = std::filesystem::path(__FILE__).parent_path().parent_path() / "bench" / "plot.py";
  std::error_code ec;
  const bool in_tree = std::filesystem::is_regular_file(script, ec);
  const std::string command = in_tree ? "python3 " + shell_quoted(script.string()) : "python3 -m flashattn.plot";
  const std::string probe = in_tree ? "import matplotlib" : "import matplotlib, flashattn.plot";
  if (std::system(("python3 -c " + shell_quoted(probe) + " >/dev/null 2>&1").c_str()) == 0) return command;
  std::fprintf(stderr,
               "flashattn bench: --plot needs python3 with matplotlib%s (pip install matplotlib, or "
               "pip install -r python/requirements-test.txt); found none. Run without --plot, and plot the JSON "
               "later with: python3 bench/plot.py FILE (or python3 -m flashattn.plot FILE)\n",
               in_tree ? "" : " and the flashattn Python package (this binary's source tree, with bench/plot.py, is gone)");
  return "";
}

int bench_command(int argc, char** argv) {
  Args args(argc, argv, 2, {"quick", "backward", "deterministic", "plot"});
  args.reject_unknown({"backend", "dtype", "quick", "backward", "deterministic", "json", "suite", "plot"});
  if (args.has("deterministic") && !args.has("backward"))
    throw std::invalid_argument("--deterministic needs --backward");
  std::string plotter;
  if (args.has("plot")) {  // checked before the sweep, which can take long
    if (!args.has("json")) throw std::invalid_argument("--plot needs --json FILE (the plot is written beside it)");
    plotter = plot_command();
    if (plotter.empty()) return 2;
  }
  const DeviceKind device = parse_backend(args.get("backend", "auto"));
  const DType dtype = parse_dtype(args.get("dtype", device == DeviceKind::cuda ? "bf16" : "f32"));
  const std::string suite = args.get("suite", device == DeviceKind::cuda ? "train" : "cpu");
  const bool with_backward = args.has("backward") && suite != "decode";
  auto shapes = bench_shapes(suite, device, dtype, args.has("quick"));
  for (Shape& s : shapes) s.deterministic = args.has("deterministic");

  struct Row { Shape s; double fwd_ms, fwd_tflops, bwd_ms = 0, bwd_tflops = 0; bool ok; };
  std::vector<Row> rows;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    progress(i, shapes.size(), shapes[i].describe());
    Workload w(shapes[i], 1234 + i);
    const auto fwd = host::time_runs(device, [&] { w.forward(); });
    Row r{shapes[i], fwd.median_ms, forward_flops(shapes[i]) / fwd.median_ms / 1e9};
    if (with_backward) {
      const auto bwd = host::time_runs(device, [&] { w.backward(); });
      r.bwd_ms = bwd.median_ms;
      r.bwd_tflops = backward_flops(shapes[i]) / bwd.median_ms / 1e9;
    }
    w.forward();
    r.ok = w.check_forward_rows(4).ok();
    rows.push_back(r);
  }
  progress(shapes.size(), shapes.size(), "done");

  // Reading K and V once is the floor of decoding: report it as bandwidth.
  auto kv_tb_s = [](const Row& r) {
    const double bytes = 2.0 * r.s.batch * r.s.keys() * r.s.kv_heads() * r.s.head_dim * element_size(r.s.dtype);
    return bytes / r.fwd_ms / 1e9;
  };
  std::printf("%-44s %10s %9s %10s %9s %8s %s\n", "shape", "fwd ms", "fwd TF/s", "bwd ms", "bwd TF/s", "KV TB/s",
              "check");
  for (const Row& r : rows)
    std::printf("%-44s %10.3f %9.2f %10.3f %9.2f %8.3f %s\n", r.s.describe().c_str(), r.fwd_ms, r.fwd_tflops,
                r.bwd_ms, r.bwd_tflops, kv_tb_s(r), r.ok ? "ok" : "FAILED");

  if (args.has("json")) {
    std::ofstream out(args.get("json", ""));
    out << "{\n  \"tool\": \"flashattn bench\",\n  \"suite\": \"" << suite << "\",\n  \"backend\": \"" << to_string(device) << "\",\n  \"dtype\": \""
        << to_string(dtype) << "\",\n  \"deterministic\": " << (args.has("deterministic") ? "true" : "false") << ",\n  \"rows\": [\n";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      out << "    {\"b\": " << r.s.batch << ", \"h\": " << r.s.heads << ", \"h_kv\": " << r.s.kv_heads()
          << ", \"n\": " << r.s.seqlen << ", \"n_k\": " << r.s.keys() << ", \"d\": " << r.s.head_dim << ", \"causal\": " << (r.s.causal ? "true" : "false")
          << ", \"fwd_ms\": " << r.fwd_ms << ", \"fwd_tflops\": " << r.fwd_tflops << ", \"kv_tb_s\": " << kv_tb_s(r);
      if (with_backward) out << ", \"bwd_ms\": " << r.bwd_ms << ", \"bwd_tflops\": " << r.bwd_tflops;
      out << ", \"check_ok\": " << (r.ok ? "true" : "false") << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
    }
    out << "  ]\n}\n";
  }
  int status = 0;
  if (!plotter.empty()) {
    const std::string json = args.get("json", "");
    std::fflush(stdout);  // the table before what the plotter prints
    if (std::system((plotter + " " + shell_quoted(json)).c_str()) != 0) {
      std::fprintf(stderr, "flashattn bench: plotting %s failed (the command was: %s %s)\n", json.c_str(),
                   plotter.c_str(), shell_quoted(json).c_str());
      status = 1;
    }
  }
  for (const Row& r : rows)
    if (!r.ok) return 1;
  return status;
}

int info_command() {
  std::printf("flashattn %s\nCUDA backend: %s\nCUDA device: %s\n", version(), built_with_cuda() ? "built" : "not built",
              cuda_available() ? "available" : "none");
  return 0;
}

void usage() {
  std::fprintf(stderr,
               "usage: flashattn run   [--batch B] [--heads H] [--heads-kv HKV] [--seqlen N] [--seqlen-k NK]\n"
               "                       [--headdim D] [--causal] [--window L,R] [--softcap C] [--alibi] [--dropout P]\n"
               "                       [--dtype f16|bf16|f32|e4m3 [--fp8-blocks]] [--backend auto|cpu|cuda]\n"
               "                       [--backward [--deterministic]]\n"
               "                       [--check-rows R] [--seed S]\n"
               "                       [--kv-cache [--page-size P] [--append N] [--rotary-dim R]]\n"
               "       flashattn bench [--backend auto|cpu|cuda] [--dtype ...] [--suite train|decode|cpu]\n"
               "                       [--quick] [--backward [--deterministic]] [--json FILE [--plot]]\n"
               "       flashattn info\n"
               "\n"
               "bench --plot also writes FILE's plot beside it (FILE with .png: TFLOP/s or TB/s against sequence\n"
               "length, one panel per head dim and mask) with python3 and matplotlib: bench/plot.py of the source\n"
               "tree this binary was built from, else `python3 -m flashattn.plot` (the installed Python package).\n"
               "It is checked before the sweep; without python3 and matplotlib, bench --plot stops with a message.\n"
               "\n"
               "run --kv-cache: the KV-cache call (flash_attn_with_kvcache) on a cache of --seqlen-k rows per sequence,\n"
               "paged with --page-size P (a multiple of 16 from 16 to 512; pages scattered over a pool), --seqlen\n"
               "queries per sequence, the cache's last --append N rows written by the call (rotated with\n"
               "--rotary-dim R). Prints time and K/V read bandwidth; checks every row against the float64\n"
               "reference (--check-rows 0 skips it: long caches take a while).\n"
               "run --alibi adds ALiBi with the standard geometric slopes 2^(-8k/H), k = 1..H (with --kv-cache too:\n"
               "the distance is counted from the last key, the cache's rows after the append). --window L,R follows\n"
               "flash-attn: -1 or a size >= the key length is unbounded; with --causal, R is 0 whatever is given.\n");
}

}  // namespace
}  // namespace flashattn::tools

int main(int argc, char** argv) {
  using namespace flashattn::tools;
  if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  try {
    const std::string command = argv[1];
    if (command == "run") return run_command(argc, argv);
    if (command == "bench") return bench_command(argc, argv);
    if (command == "info") return info_command();
    usage();
    return 2;
  } catch (const flashattn::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashattn: %s\n", e.what());
    return 2;
  }
}
