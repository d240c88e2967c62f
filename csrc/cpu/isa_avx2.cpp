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
#include "isa_x86_avx2_macros.h"
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#include "isa_body.h"
#endif
