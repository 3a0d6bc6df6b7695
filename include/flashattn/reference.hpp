#pragma once
// A float64 reference of the same function, in plain loops: slow, for checking. It takes the
// same arguments (CPU tensors of any supported dtype; ALiBi slopes included) and computes in
// double precision.
#include <vector>

#include "flashattn/attention.hpp"

namespace flashattn::reference {

// Writes args.out (and args.lse if present) rounded to their dtypes.
void forward(const ForwardArgs& args);
// Writes args.dq, args.dk, args.dv. Recomputes the forward in float64; args.out and args.lse
// are not read (the reference derives them itself), so it checks the fast paths' use of them.
void backward(const BackwardArgs& args);

}  // namespace flashattn::reference
