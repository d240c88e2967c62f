// The feature macros -mavx2 -mfma -mf16c define, for csrc/cpu/isa_avx2.cpp
// and isa_avx512.cpp (AVX-512 implies them). GCC's C++ front end does not
// define them for a target pragma; ATen's Vectorized and Sleef's headers
// test them to declare their AVX2 code. Include right after the pragma.
#pragma once

#define __AVX__ 1
#define __AVX2__ 1
#define __FMA__ 1
#define __F16C__ 1
#define __SSE3__ 1
#define __SSSE3__ 1
#define __SSE4_1__ 1
#define __SSE4_2__ 1
#define __POPCNT__ 1
