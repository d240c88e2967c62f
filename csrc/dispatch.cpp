// Which instruction set runs: the kernel table chosen once, and build_info.
#include "kernel_table.h"
#include "ops.h"

#include <ATen/Version.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace spec_verify {
namespace {

#if defined(SV_HAVE_AVX512) || defined(SV_HAVE_AVX2)
// ATen's choice, lowered to what this CPU can run. ATen detects the CPU when
// ATEN_CPU_CAPABILITY is unset, but takes the variable at its word: asked for
// avx512 on a CPU without it, it says "AVX512", and our AVX-512 table would die
// of SIGILL. The flags are the target pragmas of csrc/cpu/isa_*.cpp.
std::string runnable_capability() {
  std::string capability = at::get_cpu_capability();
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (capability == "AVX512" && !avx512) capability = "AVX2";
  if (capability == "AVX2" && !avx2) capability = "DEFAULT";
  return capability;
}
#endif

#if defined(SV_HAVE_AVX512) && defined(SV_HAVE_AVX2)
// Whether the float64 passes (mass, residual) run 512 bits wide on this CPU,
// chosen by measurement (Note [Float64 pass ISA]): SPEC_VERIFY_MASS_ISA=AVX2 or
// AVX512 decides instead. Their float -> double conversions run at half the
// throughput 512 bits wide on Zen 5 (sampled verification 29 us against 21 us
// at V = 32000, K = 4) and at full throughput on other CPUs, so one machine
// cannot decide for all. The two builds sum in different orders (4 against 8
// float64 lanes), so the choice moves a mass in its last bits: it is taken
// once per process, and 512 bits only when clearly faster (at most 0.8x the
// time), so that noise does not flip it from run to run.
bool wide_float64_passes(const KernelTable& wide, const KernelTable& narrow) {
  if (const char* forced = std::getenv("SPEC_VERIFY_MASS_ISA")) {
    const std::string isa(forced);
    if (isa == "AVX512") return true;
    if (isa == "AVX2") return false;
    // Anything else: measured, as if unset (the variable is a tuning knob, not an API).
  }
  constexpr int64_t kRow = 32768, kBlock = 512, kCalls = 6, kRounds = 7;
  std::vector<float> row(kRow);
  for (int64_t i = 0; i < kRow; ++i) row[i] = 1.0f / static_cast<float>(1 + (i * 7919) % 1000);
  std::vector<double> sums(kRow / kBlock + 1);
  bool suspect = false;
  double sink = 0.0;
  auto time = [&](const KernelTable& t) {
    const auto start = std::chrono::steady_clock::now();
    for (int c = 0; c < kCalls; ++c) sink += t.f32.mass(row.data(), kRow, kBlock, sums.data(), &suspect);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  double best_wide = 1e9, best_narrow = 1e9;
  for (int r = 0; r < kRounds; ++r) {  // alternating, the fastest of each: a busy machine's noise is one-sided
    best_wide = std::min(best_wide, time(wide));
    best_narrow = std::min(best_narrow, time(narrow));
  }
  return sink > 0.0 && best_wide <= 0.8 * best_narrow;
}
#endif

// The builds this CPU can run, widest first: their tables may be read (a
// table is built by code of its own ISA), whatever ATEN_CPU_CAPABILITY says.
std::vector<const KernelTable*> runnable_builds() {
  std::vector<const KernelTable*> builds;
#if defined(SV_HAVE_AVX512) || defined(SV_HAVE_AVX2)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
#if defined(SV_HAVE_AVX512)
  if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    builds.push_back(&AVX512::kernel_table());
  }
#endif
#if defined(SV_HAVE_AVX2)
  if (avx2) builds.push_back(&AVX2::kernel_table());
#endif
  builds.push_back(&DEFAULT::kernel_table());
  return builds;
}

// Whether this CPU has the instruction a Q8_0 kernel needs past its build's ISA
// (csrc/cpu/q8_impl.h): VNNI's vpdpbusd (cpuid), Armv8.2's sdot (the kernel's
// HWCAP_ASIMDDP, which Linux sets from ID_AA64ISAR0_EL1.DP; getauxval is how
// an aarch64 user program asks).
bool q8_runnable(const std::string& isa) {
#if defined(SV_HAVE_AVX512) || defined(SV_HAVE_AVX2)
  __builtin_cpu_init();
  if (isa == "AVX512_VNNI") return __builtin_cpu_supports("avx512vnni") != 0;
  if (isa == "AVX_VNNI") return __builtin_cpu_supports("avxvnni") != 0;  // CPUID.(EAX=7,ECX=1):EAX[4]
#endif
#if defined(__aarch64__)
  if (isa == "NEON_DOTPROD") {
#if defined(__linux__) && defined(HWCAP_ASIMDDP)
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#else
    return false;
#endif
  }
#endif
  return isa == "AVX2" || isa == "DEFAULT" || isa == "NEON";  // no more than their build's ISA
}

// The Q8_0 kernel (csrc/cpu/q8_impl.h; DESIGN.md, Note [LM head logits]). Every
// kernel computes the same bits, so the choice is speed alone: the first kernel
// this CPU runs among those of the running table's build and the builds below
// it, fastest first (AVX512_VNNI; AVX_VNNI, AVX2; DEFAULT, or NEON_DOTPROD,
// NEON). SPEC_VERIFY_Q8_ISA=<name> runs that kernel instead when this build has
// it and this CPU runs it (the tests run each kernel this way); any other value
// is ignored (a testing knob, as SPEC_VERIFY_MASS_ISA).
Q8Kernel choose_q8(const std::vector<const KernelTable*>& builds, const char* running_isa) {
  if (const char* forced = std::getenv("SPEC_VERIFY_Q8_ISA")) {
    const std::string name(forced);
    for (const KernelTable* build : builds) {
      for (const Q8Kernel& k : build->q8_kernels) {
        if (k.logits != nullptr && name == k.isa && q8_runnable(k.isa)) return k;
      }
    }
  }
  bool below = false;
  for (const KernelTable* build : builds) {
    below = below || std::string(build->isa) == running_isa;
    if (!below) continue;
    for (const Q8Kernel& k : build->q8_kernels) {
      if (k.logits != nullptr && q8_runnable(k.isa)) return k;
    }
  }
  // Not reached: DEFAULT's last kernel (DEFAULT; NEON on aarch64) needs nothing past its build.
  const Q8Kernel* k = DEFAULT::kernel_table().q8_kernels;
  while (k + 1 < DEFAULT::kernel_table().q8_kernels + kMaxQ8Kernels && k[1].logits != nullptr) ++k;
  return *k;
}

KernelTable base_table() {
#if defined(SV_HAVE_AVX512) || defined(SV_HAVE_AVX2)
  const std::string capability = runnable_capability();
#endif
#if defined(SV_HAVE_AVX512) && defined(SV_HAVE_AVX2)
  if (capability == "AVX512") {
    // The argmax and the warping run 512 bits wide; the float64 passes (mass,
    // residual) borrow the AVX2 build unless 512 bits measure clearly faster
    // here (wide_float64_passes).
    KernelTable table = AVX512::kernel_table();
    const KernelTable& narrow = AVX2::kernel_table();
    if (!wide_float64_passes(table, narrow)) {
      table.mass_isa = narrow.isa;
      table.f32.mass = narrow.f32.mass;
      table.f32.residual = narrow.f32.residual;
      table.f16.mass = narrow.f16.mass;
      table.f16.residual = narrow.f16.residual;
      table.bf16.mass = narrow.bf16.mass;
      table.bf16.residual = narrow.bf16.residual;
    }
    return table;
  }
#endif
#if defined(SV_HAVE_AVX2)
  if (capability == "AVX512" || capability == "AVX2") return AVX2::kernel_table();
#endif
  // Fallback: the generic Vectorized build (NEON on aarch64).
  return DEFAULT::kernel_table();
}

const KernelTable& select_kernels() {
  static const KernelTable table = [] {
    KernelTable t = base_table();
    const Q8Kernel q8 = choose_q8(runnable_builds(), t.isa);
    t.q8_logits = q8.logits;
    t.q8_isa = q8.isa;
    return t;
  }();
  return table;
}

}  // namespace

const KernelTable& kernels() { return select_kernels(); }

template <>
const RowOps<float>& row_ops<float>() { return kernels().f32; }
template <>
const RowOps<c10::Half>& row_ops<c10::Half>() { return kernels().f16; }
template <>
const RowOps<c10::BFloat16>& row_ops<c10::BFloat16>() { return kernels().bf16; }

std::string build_info() {
  const KernelTable& table = kernels();
  std::ostringstream out;
#if defined(__x86_64__)
  out << "arch=x86_64;";
#elif defined(__aarch64__)
  out << "arch=aarch64;";
#else
  out << "arch=other;";
#endif
  out << "isa=" << table.isa << ";mass_isa=" << table.mass_isa << ";warp_isa=" << table.warp_isa << ";head_isa=" << table.head_isa
      << ";q8_isa=" << table.q8_isa
      << ";compiled=DEFAULT";
#if defined(SV_HAVE_AVX2)
  out << ",AVX2";
#endif
#if defined(SV_HAVE_AVX512)
  out << ",AVX512";
#endif
  out << ";float_lanes=" << table.float_lanes;
  return out.str();
}

}  // namespace spec_verify
