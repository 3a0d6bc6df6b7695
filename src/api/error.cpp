#include "flashattn/error.hpp"

#include "flashattn/version.hpp"

namespace flashattn {

Error::Error(ErrorKind kind, std::string argument, std::string expected, std::string given)
    : std::runtime_error("flashattn: " + argument + ": expected " + expected + ", got " + given),
      kind_(kind),
      argument_(std::move(argument)),
      expected_(std::move(expected)),
      given_(std::move(given)) {}

const char* version() noexcept { return "0.1.0"; }

}  // namespace flashattn
