// Weights on 2 MiB pages: decoding reads every weight once a token, and on 4 KiB pages that is
// a TLB miss every 4 KiB (in a virtual machine a two-level page walk).
#pragma once

#include <cstddef>
#include <vector>

#include "mlx/array.h"

namespace exo_kernels {

// Backs the memory of the given evaluated arrays with transparent huge pages (Linux's
// MADV_COLLAPSE, 6.1 and later), copying them in place; their values do not change. Returns the
// bytes now on huge pages; 0 where the system has none to give (another OS, an older kernel).
std::size_t back_with_huge_pages(const std::vector<mlx::core::array>& arrays);

}  // namespace exo_kernels
