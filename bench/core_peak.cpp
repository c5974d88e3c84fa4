// One core's peak arithmetic rates, measured: what a convolution or MatMul
// kernel could reach at best on this CPU, so that a model's time can be read as
// a fraction of it (docs/performance.md). Each rate is twelve independent
// accumulator chains of one instruction (no loads), thread CPU time:
//   f32 FMA        vfmadd231ps on zmm (AVX-512) and on ymm (AVX2 + FMA):
//   multiply-adds per second; int8 VNNI      vpdpbusd on zmm (AVX-512 VNNI): u8
//   x s8 multiply-adds per second; int8 AVX2      vpmaddubsw + vpmaddwd +
//   vpaddd on ymm (the int8 path without VNNI): the same.
// Prints one line per rate the CPU has, then a JSON line. Usage: core_peak
// [seconds per rate, 0.5]
#include <immintrin.h>

#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

namespace {

constexpr int kChains = 12;

double thread_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Adds every lane of the chains' accumulators to *sink, so that the chains cannot be dropped. By
// reference and memcpy: no vector instruction here, so it needs no target attribute.
template <typename Lane, typename Vector>
void add_lanes(const Vector (&acc)[kChains], float* sink) {
  for (const Vector& v : acc) {
    Lane lanes[sizeof(Vector) / sizeof(Lane)];
    std::memcpy(lanes, &v, sizeof v);
    for (Lane lane : lanes) *sink += static_cast<float>(lane);
  }
}

// Counts blocks of kChains instructions until `seconds` of thread CPU time have passed:
//   PeakTimer t(seconds);
//   do { for (long rep = 0; rep < PeakTimer::kReps; ++rep) { kChains instructions } } while (t.next());
//   t.per_second(multiply-adds per block)
// No call inside the inner loop, so the accumulators stay in registers; the body is compiled with
// its function's target instruction set (a lambda would not be).
class PeakTimer {
 public:
  explicit PeakTimer(double seconds) : seconds_(seconds), start_(thread_seconds()), now_(start_) {}
  static constexpr long kReps = 100000;
  bool next() {
    blocks_ += kReps;
    now_ = thread_seconds();
    return now_ - start_ < seconds_;
  }
  double per_second(double macs_per_block) const {
    return static_cast<double>(blocks_) * macs_per_block / (now_ - start_);
  }

 private:
  double seconds_, start_, now_;
  long blocks_ = 0;
};

__attribute__((target("avx512f"))) double fma_avx512(double seconds, float* sink) {
  __m512 acc[kChains];
  __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-3f);
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  PeakTimer t(seconds);
  do {
    for (long rep = 0; rep < PeakTimer::kReps; ++rep) {
#pragma GCC unroll 12
      for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
      __asm__ volatile("" : "+v"(x));  // keeps the chains from being folded away
    }
  } while (t.next());
  add_lanes<float>(acc, sink);
  return t.per_second(kChains * 16.0);
}

__attribute__((target("avx2,fma"))) double fma_avx2(double seconds, float* sink) {
  __m256 acc[kChains];
  __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(1e-3f);
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  PeakTimer t(seconds);
  do {
    for (long rep = 0; rep < PeakTimer::kReps; ++rep) {
#pragma GCC unroll 12
      for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], x, y);
      __asm__ volatile("" : "+x"(x));
    }
  } while (t.next());
  add_lanes<float>(acc, sink);
  return t.per_second(kChains * 8.0);
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) double vnni_avx512(double seconds, float* sink) {
  __m512i acc[kChains];
  __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-5);
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_epi32(i);
  PeakTimer t(seconds);
  do {
    for (long rep = 0; rep < PeakTimer::kReps; ++rep) {
#pragma GCC unroll 12
      for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
      __asm__ volatile("" : "+v"(a));
    }
  } while (t.next());
  add_lanes<int32_t>(acc, sink);
  return t.per_second(kChains * 64.0);
}

__attribute__((target("avx2"))) double int8_avx2(double seconds, float* sink) {
  __m256i acc[kChains];
  __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-5);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_epi32(i);
  PeakTimer t(seconds);
  do {
    for (long rep = 0; rep < PeakTimer::kReps; ++rep) {
#pragma GCC unroll 12
      for (int i = 0; i < kChains; ++i)
        acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), ones));
      __asm__ volatile("" : "+x"(a));
    }
  } while (t.next());
  add_lanes<int32_t>(acc, sink);
  return t.per_second(kChains * 32.0);
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 0.5;
  if (!(seconds > 0)) {
    std::fprintf(stderr, "usage: core_peak [seconds per rate > 0]\n");
    return 2;
  }
  __builtin_cpu_init();
  float sink = 0;
  std::string json = "{";
  auto report = [&](const char *key, const char *what, double macs_per_s) {
    std::printf("%-44s %8.1f G multiply-adds/s\n", what, macs_per_s / 1e9);
    json += std::string(json.size() > 1 ? ", " : "") + "\"" + key + "\": " + std::to_string(macs_per_s / 1e9);
  };
  if (__builtin_cpu_supports("avx512f"))
    report("f32_fma_avx512", "f32 FMA, zmm (vfmadd231ps)", fma_avx512(seconds, &sink));
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    report("f32_fma_avx2", "f32 FMA, ymm (vfmadd231ps)", fma_avx2(seconds, &sink));
  if (__builtin_cpu_supports("avx512vnni"))
    report("int8_vnni_avx512", "u8 x s8, zmm VNNI (vpdpbusd)", vnni_avx512(seconds, &sink));
  if (__builtin_cpu_supports("avx2"))
    report("int8_avx2", "u8 x s8, ymm (vpmaddubsw + vpmaddwd + vpaddd)", int8_avx2(seconds, &sink));
  std::printf("%s, \"checksum\": %g}\n", json.c_str(), static_cast<double>(sink));
  return 0;
}
