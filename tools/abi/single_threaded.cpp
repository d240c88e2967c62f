// Keeps the kernel's .so within manylinux_2_28 (glibc 2.28) on a newer host.
//
// libstdc++'s <ext/atomicity.h> (reference counts in std::string, locale,
// shared_ptr) reads glibc's `__libc_single_threaded` when the host's glibc
// has it (>= 2.32): a GLIBC_2.32 symbol the .so would then need. This
// hidden definition satisfies those references inside the .so itself. Its
// value is 0 ("maybe threaded"), so libstdc++ always takes its atomic path:
// what it does on glibc < 2.32 in any process that has started a thread, as
// every torch process has. Correct everywhere; the cost is an atomic
// increment where a plain one might have done, on no hot path of this kernel.
//
// Linked by tools/build_kernel.py only (kernel-builder's Nix toolchain
// targets an old glibc itself); not part of the kernel's sources.
extern "C" {
__attribute__((visibility("hidden"))) char __libc_single_threaded = 0;
}
