#pragma once
// Which paged pools the sm90 forward reads one TMA box a page from (page_box_maps.cuh), and where
// the KV head goes among a box map's five coordinates. Host code without CUDA, so that the rule
// is tested where no GPU is (tests/test_tile_choice.cpp).
#include <cstdint>

#include "common/problem.hpp"

namespace flashattn::cuda::sm90 {

// Coordinates 2 and 4 of KV head h's box in page g: h * column_per_head and
// g * outer_per_page + h * outer_per_head; usable false: no such box for these pools.
struct PageBoxCoords {
  bool usable = false;
  int column_per_head = 0, outer_per_page = 0, outer_per_head = 0;
};

// Problem p's pools, for a kernel of head dim kernel_head_dim whose swizzle atoms are atom_width
// columns wide. A map has five dimensions, four of them (columns in an atom, rows in an
// atom, atoms along the head dim, row groups) spent on a page, so the head shares the third or
// the fifth: heads contiguous in a row (head stride == head dim: atom columns of all heads are one
// dimension) or in a page (page stride == heads_kv x head stride: pages x heads are one). Both
// pools must agree, and the head dim be the kernel's (a box reads whole atom columns, which past a
// narrower head are the next head's, not zeros).
inline PageBoxCoords page_box_coords(const detail::ForwardProblem& p, int kernel_head_dim, int atom_width) {
  PageBoxCoords c;
  const int heads = p.heads_kv, pages = p.kv.pages.num_pages;
  if (!p.kv.paged() || p.head_dim != kernel_head_dim || heads < 1 || pages < 1) return c;
  auto heads_in_row = [&](const detail::SeqTensor& t) { return heads == 1 || t.head_stride == kernel_head_dim; };
  auto heads_in_page = [&](const detail::SeqTensor& t) {
    return pages == 1 || t.batch_stride == std::int64_t(heads) * t.head_stride;
  };
  const bool in_row = heads_in_row(p.k) && heads_in_row(p.v);
  if (!in_row && !(heads_in_page(p.k) && heads_in_page(p.v))) return c;
  c.usable = true;
  c.column_per_head = in_row ? kernel_head_dim / atom_width : 0;
  c.outer_per_page = in_row ? 1 : heads;
  c.outer_per_head = in_row ? 0 : 1;
  return c;
}

}  // namespace flashattn::cuda::sm90
