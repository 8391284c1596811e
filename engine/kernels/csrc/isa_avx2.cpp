// The avx2 build of the kernels (see isa_impl.h); CMakeLists.txt gives this file its flags.
#define ISA_NS avx2
#define ISA_NAME "avx2"
#define ISA_TABLE isa_avx2
#define LANES 8
#include "isa_impl.h"
