#pragma once
#define FLASHATTN_VERSION_MAJOR 0
#define FLASHATTN_VERSION_MINOR 1
#define FLASHATTN_VERSION_PATCH 0
namespace flashattn {
const char* version() noexcept;
}
