#pragma once
// SQ_AVX2_CLONES on a hot loop function: GCC compiles it for both the x86-64 baseline the library
// targets and x86-64-v3 (AVX2 + FMA), and the loader picks the CPU's version (target_clones,
// ifunc). For the loops whose speed depends on the vector width: the elementwise float math
// (2.5-3.5x faster, measured) and the integer GEMM of the ONNX integer ops.
// SLIMQUANT_NO_CPU_CLONES (the sanitized build) compiles one version: the clones share their source
// lines, and each clone multiplies the compile time of these files.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(SLIMQUANT_NO_CPU_CLONES)
#define SQ_AVX2_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
// Loops that also gain from AVX-512 (measured on a Xeon with AVX-512: QuantizeLinear 2.3x over the
// AVX2 clone, Swish over 1.2M floats 1.22 -> 0.64 ms, Sigmoid 1.06 -> 0.74 ms).
#define SQ_AVX512_AVX2_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SQ_AVX2_CLONES
#define SQ_AVX512_AVX2_CLONES
#endif
