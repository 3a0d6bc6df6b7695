#include <cstdio>
#include "flashattn/flashattn.hpp"
int main() { std::printf("flashattn %s\n", flashattn::version()); }
