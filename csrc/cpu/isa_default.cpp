// The DEFAULT build of the per-ISA passes: the baseline of the target
// machine (SSE2 on x86-64, NEON on aarch64). Compiled on every machine.
#define CPU_CAPABILITY DEFAULT
#define CPU_CAPABILITY_DEFAULT
#include "isa_body.h"
