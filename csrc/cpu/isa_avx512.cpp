// The AVX-512 build of the per-ISA passes (x86-64 only; an empty object
// elsewhere). Enabled by pragma for the reason csrc/cpu/isa_avx2.cpp gives;
// the same feature set as ATen's AVX512 kernels (F, BW, VL, DQ, FMA).
#if defined(__x86_64__)
#if defined(__clang__)
#error "csrc/cpu/isa_avx512.cpp enables AVX-512 with GCC's target pragma; build x86-64 with GCC"
#endif
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")
// GCC's C++ front end does not define the feature macros for a target
// pragma (-mavx2 would): define the ones -mavx512{f,bw,vl,dq} -mfma -mf16c define,
// so ATen's Vectorized and Sleef's headers declare their AVX-512 code.
#define __AVX__ 1
#define __AVX2__ 1
#define __FMA__ 1
#define __F16C__ 1
#define __SSE3__ 1
#define __SSSE3__ 1
#define __SSE4_1__ 1
#define __SSE4_2__ 1
#define __POPCNT__ 1
#define __AVX512F__ 1
#define __AVX512BW__ 1
#define __AVX512VL__ 1
#define __AVX512DQ__ 1
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#include "isa_body.h"
#endif
