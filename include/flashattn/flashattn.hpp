#pragma once
// flashattn: exact, IO-aware attention (the FlashAttention family).
#include "flashattn/attention.hpp"
#include "flashattn/distributed.hpp"
#include "flashattn/fp8.hpp"
#include "flashattn/error.hpp"
#include "flashattn/kv_cache.hpp"
#include "flashattn/tensor.hpp"
#include "flashattn/version.hpp"
