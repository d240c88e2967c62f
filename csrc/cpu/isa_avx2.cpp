// The AVX2 build of the per-ISA passes (x86-64 only; an empty object elsewhere).
//
// The instruction set is enabled here, by pragma, not by -mavx2 in
// build.toml: build.toml's cxx-flags apply on every machine kernel-builder
// builds for, and -mavx2 is an error for aarch64. GCC's target pragma, put
// before any #include, compiles everything that follows as -mavx2 -mfma
// -mf16c would.
#if defined(__x86_64__)
#if defined(__clang__)
#error "csrc/cpu/isa_avx2.cpp enables AVX2 with GCC's target pragma; build x86-64 with GCC"
#endif
#pragma GCC target("avx2,fma,f16c")
// GCC's C++ front end does not define the feature macros for a target
// pragma (-mavx2 would): define the ones -mavx2 -mfma -mf16c define, so
// ATen's Vectorized and Sleef's headers declare their AVX2 code.
#define __AVX__ 1
#define __AVX2__ 1
#define __FMA__ 1
#define __F16C__ 1
#define __SSE3__ 1
#define __SSSE3__ 1
#define __SSE4_1__ 1
#define __SSE4_2__ 1
#define __POPCNT__ 1
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#include "isa_body.h"
#endif
