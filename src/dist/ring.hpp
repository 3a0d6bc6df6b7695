#pragma once
#include "dist/zigzag.hpp"
#include "flashattn/distributed.hpp"

namespace flashattn::dist::detail {

void ring_forward(const ForwardArgs& args, Communicator& comm, const Zigzag& z);
void ring_backward(const BackwardArgs& args, Communicator& comm, const Zigzag& z);
void all_to_all_forward(const ForwardArgs& args, Communicator& comm, const Zigzag& z);
void all_to_all_backward(const BackwardArgs& args, Communicator& comm, const Zigzag& z);

}  // namespace flashattn::dist::detail
