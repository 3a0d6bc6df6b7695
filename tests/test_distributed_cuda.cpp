// flashattn::dist on GPUs over NCCL (ctest label `gpu`): one thread per GPU in this process, each
// with its own NCCL communicator and stream, against one single-GPU call on the whole sequence.
// Needs a build with NCCL and 2+ GPUs (skipped otherwise); FLASHATTN_DIST_GPUS caps the ranks.
#include <cuda_runtime.h>

#include <cstdlib>
#include <mutex>

#include "distributed_check.hpp"

namespace {

using namespace flashattn;
using namespace flashattn::testing::distributed;

void check(cudaError_t e) {
  if (e != cudaSuccess) throw std::runtime_error(cudaGetErrorString(e));
}

int gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  if (const char* cap = std::getenv("FLASHATTN_DIST_GPUS")) n = std::min(n, std::atoi(cap));
  return n;
}

class NcclGpus final : public Placement {
 public:
  ~NcclGpus() override {
    for (auto& [p, device] : blocks_) {
      cudaSetDevice(device);
      cudaFree(p);
    }
    for (std::size_t r = 0; r < streams_.size(); ++r) {
      cudaSetDevice(int(r));
      cudaStreamDestroy(streams_[r]);
    }
  }
  void prepare(int ranks) override {
    ranks_ = ranks;
    id_ = dist::nccl_unique_id();
    streams_.resize(ranks);
    for (int r = 0; r < ranks; ++r) {
      check(cudaSetDevice(r));
      check(cudaStreamCreateWithFlags(&streams_[r], cudaStreamNonBlocking));
    }
  }
  std::unique_ptr<dist::Communicator> join(int r) override {
    check(cudaSetDevice(r));
    return dist::make_nccl_communicator(id_, r, ranks_, r);
  }
  TensorView put(Host& h, int r) override {
    check(cudaSetDevice(r));
    void* p = nullptr;
    check(cudaMalloc(&p, h.bytes.size() + 16));
    check(cudaMemcpy(p, h.bytes.data(), h.bytes.size(), cudaMemcpyHostToDevice));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      blocks_.emplace_back(p, r);
    }
    TensorView t = h.view();
    t.data = p;
    t.device = DeviceKind::cuda;
    t.device_index = r;
    return t;
  }
  void get(Host& h, const TensorView& t, int r) override {
    check(cudaSetDevice(r));
    check(cudaMemcpy(h.bytes.data(), t.data, h.bytes.size(), cudaMemcpyDeviceToHost));
  }
  void* stream(int r) override { return streams_[r]; }
  void sync(int r) override {
    check(cudaSetDevice(r));
    check(cudaStreamSynchronize(streams_[r]));
  }

 private:
  int ranks_ = 0;
  std::vector<std::uint8_t> id_;
  std::vector<cudaStream_t> streams_;
  std::mutex mutex_;
  std::vector<std::pair<void*, int>> blocks_;
};

void run_gpu_case(Config c) {
  if (!dist::built_with_nccl()) GTEST_SKIP() << "built without NCCL";
  if (gpus() < c.ranks) GTEST_SKIP() << "needs " << c.ranks << " GPUs";
  c.tolerance16 = 1.5e-2;
  NcclGpus place;
  run_case(c, place);
}

Config base(int ranks, DType dtype) {
  Config c;
  c.ranks = ranks, c.dtype = dtype, c.head_dim = 128, c.heads_q = 8, c.heads_kv = 2, c.chunk = 256;
  return c;
}

TEST(DistributedCuda, RingCausalGqa) { run_gpu_case(base(2, DType::bf16)); }

TEST(DistributedCuda, RingFullOddChunk) {
  Config c = base(2, DType::bf16);
  c.causal = false, c.chunk = 333, c.batch = 2;
  run_gpu_case(c);
}

TEST(DistributedCuda, RingVariableLengthSoftcap) {
  Config c = base(2, DType::bf16);
  c.varlen = true, c.softcap = 20.0f, c.documents = {4 * 100, 4 * 7, 0, 4 * 300};
  run_gpu_case(c);
}

TEST(DistributedCuda, AllToAll) {
  Config c = base(2, DType::bf16);
  c.strategy = dist::Strategy::all_to_all;
  run_gpu_case(c);
}

TEST(DistributedCuda, AllGpus) {  // every GPU of the machine (4 or 8 where there are)
  const int n = gpus();
  if (n < 3) GTEST_SKIP() << "fewer than 3 GPUs";
  for (auto s : {dist::Strategy::ring, dist::Strategy::all_to_all}) {
    Config c = base(n, DType::bf16);
    c.strategy = s, c.heads_q = 2 * n, c.heads_kv = n % 2 == 0 ? n / 2 : n;
    run_gpu_case(c);
  }
}

}  // namespace
