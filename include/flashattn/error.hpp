#pragma once
// flashattn::Error: every failure the library reports. Invalid arguments name the argument,
// what was expected and what was given; nothing has been written when one is thrown.
#include <stdexcept>
#include <string>

namespace flashattn {

enum class ErrorKind {
  invalid_argument,  // a value, shape, stride or pointer is wrong
  invalid_type,      // a dtype or device is wrong
  unsupported,       // valid, but not built or not implemented for this backend
  runtime,           // the backend failed while running (CUDA error, allocation)
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string argument, std::string expected, std::string given);

  ErrorKind kind() const noexcept { return kind_; }
  const std::string& argument() const noexcept { return argument_; }
  const std::string& expected() const noexcept { return expected_; }
  const std::string& given() const noexcept { return given_; }

 private:
  ErrorKind kind_;
  std::string argument_, expected_, given_;
};

}  // namespace flashattn
