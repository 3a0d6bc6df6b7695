// flashattn._C's context-parallel entry points (flashattn::dist) and its communicators: NCCL
// (from a unique id that Python hands to every rank), and a transport whose methods are a Python
// object's, for CPU tensors (flashattn.distributed's torch.distributed transport, or any other).
#include "distributed.hpp"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include "flashattn/distributed.hpp"
#include "flashattn/error.hpp"
#include "python_tensors.hpp"

namespace flashattn::python {
namespace {

using namespace nb::literals;

// Buffers as writable memoryviews over the library's memory, valid during the call.
nb::list memoryviews(const std::vector<dist::Buffer>& buffers) {
  nb::list list;
  for (const dist::Buffer& b : buffers)
    list.append(nb::steal(PyMemoryView_FromMemory(static_cast<char*>(b.data), Py_ssize_t(b.bytes), PyBUF_WRITE)));
  return list;
}

// The transport is a Python object with
//   exchange_start(send, to, recv, src) -> handle   (lists of memoryviews; starts the transfers)
//   exchange_finish(handle)                         (waits for them)
//   all_to_all(send, recv)                          (send[j] to rank j, recv[j] from rank j)
// Its errors come back as flashattn::Error (runtime) naming the transport.
class PythonCommunicator final : public dist::Communicator {
 public:
  PythonCommunicator(nb::object transport, int rank, int size) : transport_(std::move(transport)), rank_(rank), size_(size) {}
  ~PythonCommunicator() override {
    nb::gil_scoped_acquire gil;
    handles_.clear();
    transport_.reset();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  DeviceKind device() const override { return DeviceKind::cpu; }

  int start_exchange(const std::vector<dist::Buffer>& send, int to, const std::vector<dist::Buffer>& recv, int from,
                     void*) override {
    return call("exchange_start", [&] {
      handles_[next_] = transport_.attr("exchange_start")(memoryviews(send), to, memoryviews(recv), from);
      return next_++;
    });
  }
  void finish_exchange(int ticket, void*) override {
    call("exchange_finish", [&] {
      auto it = handles_.find(ticket);
      if (it == handles_.end()) throw Error(ErrorKind::invalid_argument, "ticket", "a started exchange", std::to_string(ticket));
      nb::object handle = std::move(it->second);
      handles_.erase(it);
      transport_.attr("exchange_finish")(handle);
      return 0;
    });
  }
  void all_to_all(const std::vector<dist::Buffer>& send, const std::vector<dist::Buffer>& recv, void*) override {
    call("all_to_all", [&] {
      transport_.attr("all_to_all")(memoryviews(send), memoryviews(recv));
      return 0;
    });
  }

 private:
  template <class F>
  int call(const char* method, F&& f) {
    nb::gil_scoped_acquire gil;
    try {
      return f();
    } catch (nb::python_error& e) {
      const std::string what = e.what();
      e.restore();
      PyErr_Clear();
      throw Error(ErrorKind::runtime, std::string("transport.") + method, "success", what);
    }
  }

  nb::object transport_;
  int rank_, size_;
  int next_ = 0;
  std::map<int, nb::object> handles_;
};

dist::Strategy strategy_of(const std::string& name) {
  if (name == "ring") return dist::Strategy::ring;
  if (name == "all_to_all") return dist::Strategy::all_to_all;
  throw Error(ErrorKind::invalid_argument, "strategy", "'ring' or 'all_to_all'", "'" + name + "'");
}


}  // namespace

void register_distributed(nb::module_& m) {
  nb::class_<dist::Communicator>(m, "Communicator",
                                 "A transport of flashattn's context-parallel attention (flashattn::dist::Communicator).")
      .def_prop_ro("rank", &dist::Communicator::rank)
      .def_prop_ro("size", &dist::Communicator::size);

  m.def("built_with_nccl", &dist::built_with_nccl, "Whether this build has the NCCL transport.");
  m.def(
      "nccl_unique_id",
      [] {
        const auto id = dist::nccl_unique_id();
        return nb::bytes(reinterpret_cast<const char*>(id.data()), id.size());
      },
      "A new NCCL unique id (bytes) for nccl_communicator(); made on one rank, handed to all.");
  m.def(
      "nccl_communicator",
      [](nb::bytes unique_id, int rank, int size, int device) {
        const auto* p = static_cast<const std::uint8_t*>(unique_id.data());
        std::vector<std::uint8_t> id(p, p + unique_id.size());
        nb::gil_scoped_release released;  // ncclCommInitRank waits for every rank
        return dist::make_nccl_communicator(id, rank, size, device);
      },
      "unique_id"_a, "rank"_a, "size"_a, "device"_a,
      "A Communicator over a new NCCL communicator of `size` ranks on CUDA device `device`.");
  m.def(
      "_null_communicator",
      [](int rank, int size, bool cuda) {
        return dist::make_null_communicator(rank, size, cuda ? DeviceKind::cuda : DeviceKind::cpu);
      },
      "rank"_a, "size"_a, "cuda"_a,
      "For benchmarks: a Communicator that transfers nothing between ranks: received buffers get local copies "
      "of the sent ones (wrong results, real data; the compute's time alone).");
  m.def(
      "python_communicator",
      [](nb::object transport, int rank, int size) -> std::unique_ptr<dist::Communicator> {
        if (size < 1 || rank < 0 || rank >= size)
          throw Error(ErrorKind::invalid_argument, "rank", "0 <= rank < size", std::to_string(rank) + " of " + std::to_string(size));
        for (const char* method : {"exchange_start", "exchange_finish", "all_to_all"})
          if (!nb::hasattr(transport, method))
            throw Error(ErrorKind::invalid_type, "transport", std::string("an object with a method ") + method,
                        nb::str(transport.type()).c_str());
        return std::make_unique<PythonCommunicator>(std::move(transport), rank, size);
      },
      "transport"_a, "rank"_a, "size"_a,
      "A Communicator for CPU tensors whose transfers are `transport`'s methods exchange_start(send, to, recv, src) "
      "-> handle, exchange_finish(handle) and all_to_all(send, recv), over lists of memoryviews.");

}

dist::Strategy parse_strategy(const std::string& name) { return strategy_of(name); }

}  // namespace flashattn::python
