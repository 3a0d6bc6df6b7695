#pragma once
// The sm80 family's entry points, included by the generated instance files.
#include "cuda/sm80/api.hpp"
#include "cuda/sm80/forward_launch.cuh"
#include "cuda/sm80/backward_launch.cuh"
