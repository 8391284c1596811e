// The avx512 build of the kernels (see isa_impl.h); CMakeLists.txt gives this file its flags.
#define ISA_NS avx512
#define ISA_NAME "avx512"
#define ISA_TABLE isa_avx512
#define LANES 16
#include "isa_impl.h"
