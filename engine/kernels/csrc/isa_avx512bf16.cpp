// The avx512 build plus AVX512-BF16 and AVX512-VNNI dot products (see isa_impl.h);
// CMakeLists.txt gives this file its flags.
#define ISA_NS avx512bf16
#define ISA_NAME "avx512bf16"
#define ISA_TABLE isa_avx512bf16
#define LANES 16
#if defined(__AVX512BF16__)
#define EXO_BF16_DOT 1
#endif
#include "isa_impl.h"
