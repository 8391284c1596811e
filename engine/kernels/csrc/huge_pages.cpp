#include "huge_pages.h"

#include <cstdint>
#include <fstream>
#include <set>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace exo_kernels {

#if defined(__linux__)
namespace {

#ifndef MADV_COLLAPSE
constexpr int MADV_COLLAPSE = 25;  // Linux 6.1; older headers lack the name
#endif

std::uintptr_t huge_page_size() {
  std::ifstream file("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size");
  std::uintptr_t size = 0;
  return file >> size && size > 0 && (size & (size - 1)) == 0 ? size : 0;
}

}  // namespace

std::size_t back_with_huge_pages(const std::vector<mlx::core::array>& arrays) {
  static const std::uintptr_t page = huge_page_size();
  if (page == 0) return 0;
  // Every huge page that holds some of the arrays' bytes. Its other bytes are this process's
  // too (the allocator's neighbouring blocks), and a collapse leaves every value as it was;
  // one that reaches unmapped memory fails and stays as it is.
  std::set<std::uintptr_t> starts;
  for (const auto& a : arrays) {
    if (!a.is_available() || a.nbytes() == 0) continue;
    const auto begin = reinterpret_cast<std::uintptr_t>(a.data<char>());
    for (auto at = begin & ~(page - 1); at < begin + a.nbytes(); at += page) starts.insert(at);
  }
  std::size_t backed = 0;
  for (const auto at : starts) {
    if (madvise(reinterpret_cast<void*>(at), page, MADV_COLLAPSE) == 0) backed += page;
  }
  return backed;
}

#else

std::size_t back_with_huge_pages(const std::vector<mlx::core::array>&) { return 0; }

#endif

}  // namespace exo_kernels
