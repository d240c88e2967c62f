// The AVX-512 build of the per-ISA passes (x86-64 only; an empty object
// elsewhere). Enabled by pragma for the reason csrc/cpu/isa_avx2.cpp gives;
// the same feature set as ATen's AVX512 kernels (F, BW, VL, DQ, FMA).
#if defined(__x86_64__)
#if defined(__clang__)
#error "csrc/cpu/isa_avx512.cpp enables AVX-512 with GCC's target pragma; build x86-64 with GCC"
#endif
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")
#include "isa_x86_avx2_macros.h"
// And the AVX-512 ones -mavx512{f,bw,vl,dq} define (same reason).
#define __AVX512F__ 1
#define __AVX512BW__ 1
#define __AVX512VL__ 1
#define __AVX512DQ__ 1
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#include "isa_body.h"
#endif
