// The NCCL transport (built when CMake finds NCCL beside the CUDA backend: FLASHATTN_WITH_NCCL).
// Transfers run on the communicator's own stream, of the greatest priority: an exchange waits
// (cudaStreamWaitEvent) for the work queued on the caller's stream so far, runs
// ncclSend/ncclRecv in one group, and records an event that finish_exchange makes the caller's
// stream wait for. The caller's stream also waits until the transfer is next in line on ours,
// so that its kernel reaches the GPU before the attention kernels queued after it. Nothing
// blocks the host.
#include <cstring>
#include <string>
#include <vector>

#include "flashattn/distributed.hpp"
#include "flashattn/error.hpp"

#ifdef FLASHATTN_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace flashattn::dist {

#ifdef FLASHATTN_WITH_NCCL
namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(ErrorKind::runtime, what, "cudaSuccess", cudaGetErrorString(e));
}
void check_nccl(ncclResult_t e, const char* what) {
  if (e != ncclSuccess) throw Error(ErrorKind::runtime, what, "ncclSuccess", ncclGetErrorString(e));
}

// Restores the current device on scope exit.
struct DeviceGuard {
  int previous = 0;
  explicit DeviceGuard(int device) {
    check_cuda(cudaGetDevice(&previous), "cudaGetDevice");
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(previous); }
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const std::vector<std::uint8_t>& id, int rank, int size, int device) : rank_(rank), size_(size), device_(device) {
    if (id.size() != sizeof(ncclUniqueId))
      throw Error(ErrorKind::invalid_argument, "unique_id", std::to_string(sizeof(ncclUniqueId)) + " bytes",
                  std::to_string(id.size()));
    if (size < 1 || rank < 0 || rank >= size)
      throw Error(ErrorKind::invalid_argument, "rank", "0 <= rank < size", std::to_string(rank) + " of " + std::to_string(size));
    ncclUniqueId uid;
    std::memcpy(&uid, id.data(), sizeof uid);
    DeviceGuard guard(device);
    check_nccl(ncclCommInitRank(&comm_, size, uid, rank), "ncclCommInitRank");
    // The greatest priority: where a transfer's kernel and an attention kernel wait for SMs at
    // the same time, the block scheduler places the transfer's CTAs first.
    int least = 0, greatest = 0;  // numerically: least >= greatest
    check_cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
    check_cuda(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest),
               "cudaStreamCreateWithPriority");
  }
  ~NcclCommunicator() override {
    DeviceGuard guard(device_);
    for (auto& e : events_) cudaEventDestroy(e);
    for (auto& e : ready_) cudaEventDestroy(e);
    for (auto& e : queued_) cudaEventDestroy(e);
    cudaStreamDestroy(stream_);
    ncclCommDestroy(comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  DeviceKind device() const override { return DeviceKind::cuda; }

  int start_exchange(const std::vector<Buffer>& send, int to, const std::vector<Buffer>& recv, int from,
                     void* stream) override {
    DeviceGuard guard(device_);
    const int ticket = take_ticket();
    auto caller = static_cast<cudaStream_t>(stream);
    check_cuda(cudaEventRecord(ready_[ticket], caller), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(stream_, ready_[ticket], 0), "cudaStreamWaitEvent");
    check_cuda(cudaEventRecord(queued_[ticket], stream_), "cudaEventRecord");
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (const Buffer& b : send) check_nccl(ncclSend(b.data, b.bytes, ncclUint8, to, comm_, stream_), "ncclSend");
    for (const Buffer& b : recv) check_nccl(ncclRecv(b.data, b.bytes, ncclUint8, from, comm_, stream_), "ncclRecv");
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    check_cuda(cudaEventRecord(events_[ticket], stream_), "cudaEventRecord");
    // The caller's next kernels wait until the transfer's kernel is next in line on our stream:
    // a persistent attention kernel launched first would hold every SM until it ends, and the
    // transfer would run after it instead of under it.
    check_cuda(cudaStreamWaitEvent(caller, queued_[ticket], 0), "cudaStreamWaitEvent");
    return ticket;
  }
  void finish_exchange(int ticket, void* stream) override {
    if (ticket < 0 || ticket >= int(events_.size()) || !busy_[ticket])
      throw Error(ErrorKind::invalid_argument, "ticket", "a started exchange", std::to_string(ticket));
    DeviceGuard guard(device_);
    check_cuda(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), events_[ticket], 0), "cudaStreamWaitEvent");
    busy_[ticket] = false;
  }
  void all_to_all(const std::vector<Buffer>& send, const std::vector<Buffer>& recv, void* stream) override {
    DeviceGuard guard(device_);
    // On the caller's stream: nothing to overlap with here.
    auto caller = static_cast<cudaStream_t>(stream);
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int j = 0; j < size_; ++j) {
      check_nccl(ncclSend(send[j].data, send[j].bytes, ncclUint8, j, comm_, caller), "ncclSend");
      check_nccl(ncclRecv(recv[j].data, recv[j].bytes, ncclUint8, j, comm_, caller), "ncclRecv");
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  }

 private:
  // An event pair not in use (events are reused once their exchange was finished).
  int take_ticket() {
    for (std::size_t i = 0; i < busy_.size(); ++i)
      if (!busy_[i]) {
        busy_[i] = true;
        return int(i);
      }
    cudaEvent_t done, ready, queued;
    check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventCreateWithFlags(&queued, cudaEventDisableTiming), "cudaEventCreate");
    events_.push_back(done);
    ready_.push_back(ready);
    queued_.push_back(queued);
    busy_.push_back(true);
    return int(busy_.size() - 1);
  }

  int rank_, size_, device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_, ready_, queued_;
  std::vector<bool> busy_;
};

}  // namespace

bool built_with_nccl() noexcept { return true; }

std::vector<std::uint8_t> nccl_unique_id() {
  ncclUniqueId id;
  check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  const auto* p = reinterpret_cast<const std::uint8_t*>(&id);
  return std::vector<std::uint8_t>(p, p + sizeof id);
}

std::unique_ptr<Communicator> make_nccl_communicator(const std::vector<std::uint8_t>& unique_id, int rank, int size,
                                                     int device) {
  return std::make_unique<NcclCommunicator>(unique_id, rank, size, device);
}

#else

bool built_with_nccl() noexcept { return false; }

std::vector<std::uint8_t> nccl_unique_id() {
  throw Error(ErrorKind::unsupported, "nccl", "a build with NCCL (CUDA backend and NCCL found by CMake)",
              "a build without NCCL");
}

std::unique_ptr<Communicator> make_nccl_communicator(const std::vector<std::uint8_t>&, int, int, int) {
  throw Error(ErrorKind::unsupported, "nccl", "a build with NCCL (CUDA backend and NCCL found by CMake)",
              "a build without NCCL");
}

#endif

}  // namespace flashattn::dist
