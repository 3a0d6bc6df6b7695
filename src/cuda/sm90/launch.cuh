#pragma once
// The sm90 family's entry points, included by the generated instance files.
//
// wgmma shapes with N not a power-of-two multiple of 16 (80, 112, ...) must be enabled before
// the first CuTe header: without them CuTe splits such a key block into 64x16x16 instructions,
// several times slower (forward_traits.cuh asserts the shapes it gets).
#ifndef CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#endif
#include "cuda/sm90/api.hpp"
#include "cuda/sm90/backward_launch.cuh"
#include "cuda/sm90/forward_launch.cuh"
