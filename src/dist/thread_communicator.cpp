// Communicators between threads of one process (and the null one, for measurements) (CPU tensors): every send is copied into the
// receiver's mailbox at once; a receive waits for its message. Messages between two ranks
// arrive in the order they were sent, which is all the algorithms need.
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dist/ops.hpp"
#include "flashattn/distributed.hpp"
#include "flashattn/error.hpp"

namespace flashattn::dist {
namespace {

struct Mailboxes {
  std::mutex mutex;
  std::condition_variable arrived;
  std::map<std::pair<int, int>, std::deque<std::vector<std::vector<char>>>> queues;  // (from, to)

  void post(int from, int to, const std::vector<Buffer>& send) {
    std::vector<std::vector<char>> message;
    for (const Buffer& b : send) {
      const char* p = static_cast<const char*>(b.data);
      message.emplace_back(p, p + b.bytes);
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      queues[{from, to}].push_back(std::move(message));
    }
    arrived.notify_all();
  }
  void take(int from, int to, const std::vector<Buffer>& recv) {
    std::unique_lock<std::mutex> lock(mutex);
    auto& queue = queues[{from, to}];
    arrived.wait(lock, [&] { return !queue.empty(); });
    std::vector<std::vector<char>> message = std::move(queue.front());
    queue.pop_front();
    lock.unlock();
    if (message.size() != recv.size())
      throw Error(ErrorKind::runtime, "comm", std::to_string(recv.size()) + " buffers from rank " + std::to_string(from),
                  std::to_string(message.size()));
    for (std::size_t i = 0; i < recv.size(); ++i) {
      if (message[i].size() != recv[i].bytes)
        throw Error(ErrorKind::runtime, "comm", std::to_string(recv[i].bytes) + " bytes", std::to_string(message[i].size()));
      std::memcpy(recv[i].data, message[i].data(), recv[i].bytes);
    }
  }
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<Mailboxes> boxes, int rank, int size)
      : boxes_(std::move(boxes)), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  DeviceKind device() const override { return DeviceKind::cpu; }

  int start_exchange(const std::vector<Buffer>& send, int to, const std::vector<Buffer>& recv, int from,
                     void*) override {
    boxes_->post(rank_, to, send);
    pending_[next_ticket_] = Pending{from, recv};
    return next_ticket_++;
  }
  void finish_exchange(int ticket, void*) override {
    auto it = pending_.find(ticket);
    if (it == pending_.end()) throw Error(ErrorKind::invalid_argument, "ticket", "a started exchange", std::to_string(ticket));
    const Pending p = it->second;
    pending_.erase(it);
    boxes_->take(p.from, rank_, p.recv);
  }
  void all_to_all(const std::vector<Buffer>& send, const std::vector<Buffer>& recv, void*) override {
    for (int j = 0; j < size_; ++j) boxes_->post(rank_, j, {send[j]});
    for (int j = 0; j < size_; ++j) boxes_->take(j, rank_, {recv[j]});
  }

 private:
  struct Pending {
    int from;
    std::vector<Buffer> recv;
  };
  std::shared_ptr<Mailboxes> boxes_;
  int rank_, size_;
  int next_ticket_ = 0;
  std::map<int, Pending> pending_;
};

class NullCommunicator final : public Communicator {
 public:
  NullCommunicator(int rank, int size, DeviceKind device) : rank_(rank), size_(size), device_(device) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  DeviceKind device() const override { return device_; }
  // Each received buffer gets the bytes of the sent buffer at its place (a local copy on
  // `stream`), so that the kernels compute on real data: on never-written buffers (zeros) the
  // ring's remote steps ran about 10% faster than on the data NCCL delivers (lower power on zero
  // operands is our reading).
  int start_exchange(const std::vector<Buffer>& send, int, const std::vector<Buffer>& recv, int, void* stream) override {
    stand_in(send, recv, stream);
    return 0;
  }
  void finish_exchange(int, void*) override {}
  void all_to_all(const std::vector<Buffer>& send, const std::vector<Buffer>& recv, void* stream) override {
    stand_in(send, recv, stream);
  }

 private:
  void stand_in(const std::vector<Buffer>& send, const std::vector<Buffer>& recv, void* stream) const {
    for (std::size_t i = 0; i < send.size() && i < recv.size(); ++i)
      if (send[i].bytes == recv[i].bytes && send[i].data != recv[i].data)
        detail::ops_for(device_).copy_bytes(recv[i].data, send[i].data, recv[i].bytes, stream);
  }
  int rank_, size_;
  DeviceKind device_;
};

}  // namespace

std::unique_ptr<Communicator> make_null_communicator(int rank, int size, DeviceKind device) {
  if (size < 1 || rank < 0 || rank >= size)
    throw Error(ErrorKind::invalid_argument, "rank", "0 <= rank < size", std::to_string(rank) + " of " + std::to_string(size));
  return std::make_unique<NullCommunicator>(rank, size, device);
}

std::vector<std::unique_ptr<Communicator>> make_thread_communicators(int size) {
  if (size < 1) throw Error(ErrorKind::invalid_argument, "size", ">= 1", std::to_string(size));
  auto boxes = std::make_shared<Mailboxes>();
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < size; ++r) comms.push_back(std::make_unique<ThreadCommunicator>(boxes, r, size));
  return comms;
}

}  // namespace flashattn::dist
