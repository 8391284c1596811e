// Which kernel table this CPU runs: asked of the CPU (and its OS) at run time, never assumed
// from the machine that built the extension.
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels.h"

namespace exo_kernels {

namespace {
bool cpu_has(const char* name) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (std::strcmp(name, "avx512bf16") == 0)
    return cpu_has("avx512") && __builtin_cpu_supports("avx512bf16") &&
           __builtin_cpu_supports("avx512vnni");
  if (std::strcmp(name, "avx512") == 0)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  if (std::strcmp(name, "avx2") == 0)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
#endif
  return std::strcmp(name, "portable") == 0;
}
}  // namespace

bool isa_supported(const char* name) { return cpu_has(name); }

const Isa* isa_by_name(const char* name) {
  if (std::strcmp(name, "avx512bf16") == 0) return &isa_avx512bf16;
  if (std::strcmp(name, "avx512") == 0) return &isa_avx512;
  if (std::strcmp(name, "avx2") == 0) return &isa_avx2;
  if (std::strcmp(name, "portable") == 0) return &isa_portable;
  return nullptr;
}

namespace {
const Isa* detect() {
  // EXO_TUI_KERNELS_ISA=avx2|portable caps the choice (to compare the builds on one machine).
  const char* cap = std::getenv("EXO_TUI_KERNELS_ISA");
  const char* order[] = {"avx512bf16", "avx512", "avx2", "portable"};
  bool allowed = cap == nullptr || *cap == '\0';
  for (const char* name : order) {
    if (!allowed && std::strcmp(name, cap) == 0) allowed = true;
    if (allowed && cpu_has(name)) return isa_by_name(name);
  }
  return &isa_portable;
}
std::atomic<const Isa*> chosen{nullptr};
}  // namespace

const Isa& best_isa() {
  const Isa* isa = chosen.load(std::memory_order_acquire);
  if (isa == nullptr) {
    isa = detect();
    chosen.store(isa, std::memory_order_release);
  }
  return *isa;
}

bool use_isa(const char* name) {
  const Isa* isa = isa_by_name(name);
  if (isa == nullptr || !cpu_has(name)) return false;
  chosen.store(isa, std::memory_order_release);
  return true;
}

}  // namespace exo_kernels
