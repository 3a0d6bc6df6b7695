#pragma once
// flashattn._C's context-parallel part (distributed.cpp): the Communicator class and its
// factories; module.cpp binds dist_forward / dist_backward beside forward / backward.
#include <string>

#include <nanobind/nanobind.h>

#include "flashattn/distributed.hpp"

namespace flashattn::python {

namespace nb = nanobind;

void register_distributed(nb::module_& m);
// 'ring' or 'all_to_all' (ValueError otherwise).
dist::Strategy parse_strategy(const std::string& name);

}  // namespace flashattn::python
