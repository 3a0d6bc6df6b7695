#include <gtest/gtest.h>
#include "flashattn/flashattn.hpp"
TEST(Smoke, Version) { EXPECT_STREQ(flashattn::version(), "0.1.0"); }
