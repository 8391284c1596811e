// The portable build of the kernels (see isa_impl.h); CMakeLists.txt gives this file its flags.
#define ISA_NS portable
#define ISA_NAME "portable"
#define ISA_TABLE isa_portable
#define LANES 4
#include "isa_impl.h"
