#pragma once
// oneDNN lists the implementations of a primitive in a fixed preference order, which is not the
// fastest for every shape: on an AVX-512 VNNI Xeon its brgemm int8 convolutions (its first choice)
// run 3x3 convolutions with 16-64 channels 1.2-1.7x slower than its direct jit_int8 kernel. Kernels
// that build such primitives ask fastest_implementation(). It considers only candidates proven
// equivalent to the first choice: the same layouts, the same ISA (oneDNN's int8 kernels for ISAs
// without VNNI saturate 16-bit pair sums, so they compute other numbers on a VNNI CPU) and the same
// output bits on probe data. It times those once per distinct problem, thread count and process, on
// zero-filled arguments (the speed of these kernels does not depend on the values), and returns
// the fastest if it is clearly faster (at most 85% of the first choice's time), else the first
// choice. Problems over 64 MiB of arguments are not timed. The choice changes speed only, never a
// result, so timing noise cannot make two runs of one command write different files.
// SLIMQUANT_DNNL_TUNING=0 keeps oneDNN's first choice; =alternative adopts the last equivalent
// candidate whatever its speed (to show in tests that the choice does not change results).
//
// Timing costs seconds at the first run of a large model (PP-OCRv4 det: 10 s against 0.9 s
// untimed), so the choices are kept on disk, per machine, and a later process takes them from
// there: SLIMQUANT_TUNING_CACHE names the file (default $XDG_CACHE_HOME/slimquant/dnnl_choices.tsv,
// else ~/.cache/slimquant/dnnl_choices.tsv; 0 keeps them in memory only). The file's first line
// names the machine (CPU model, oneDNN's effective ISA, oneDNN's version); a file written for
// another is ignored and replaced. The file only ever changes speed, never a result.
#include <dnnl.hpp>

#include <cstddef>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

namespace slimquant::runtime::dnnl_kernels {

// How many candidates (oneDNN's first differently named non-reference implementations) are timed
// at most, looking that far down its list.
inline constexpr size_t kMaxTimedImplementations = 3;
inline constexpr size_t kMaxListedImplementations = 12;

// The ISA an implementation name (impl_info_str, e.g. "brgconv:avx512_core_vnni") ends with.
std::string implementation_isa(const std::string& impl_name);

// The candidates the choice may adopt: oneDNN's first choice, then up to kMaxTimedImplementations - 1
// further differently named non-reference implementations that read and write its layouts, use its
// ISA and give its output bit for bit on probe data (full-range integers, floats of varied
// magnitude). nth(i) as for fastest_implementation_name.
std::vector<dnnl::primitive_desc> equivalent_implementations(const std::function<dnnl::primitive_desc(size_t)>& nth);

// Core of fastest_implementation: the name (impl_info_str) of the fastest candidate for `key` at
// the current OpenMP thread count, from the process-wide cache or by timing; empty for oneDNN's
// first choice. nth(i) returns the
// descriptor i steps down oneDNN's list (a null primitive_desc past its end).
std::string fastest_implementation_name(const std::string& key,
                                        const std::function<dnnl::primitive_desc(size_t)>& nth);

// PD: a oneDNN primitive_desc type; make(): a fresh descriptor (oneDNN's first choice); key: a
// string naming everything make() builds from (shapes, layouts, data types, attributes); the
// operation descriptor make() uses must outlive the call (oneDNN's next_impl() reads it). The cache
// keeps names, not list positions: oneDNN's list for one key can differ between descriptors (how
// many brgemm variants accept a given set of output scales, for one). Throws what make() throws.
template <class PD, class Make>
PD fastest_implementation(const std::string& key, Make&& make) {
  auto nth = [&](size_t steps) -> PD {
    PD pd = make();
    for (size_t i = 0; i < steps; ++i)
      if (!pd.next_impl()) return PD();
    return pd;
  };
  const std::string best = fastest_implementation_name(key, [&](size_t i) -> dnnl::primitive_desc { return nth(i); });
  PD pd = make();
  if (best.empty() || best == pd.impl_info_str()) return pd;
  for (size_t i = 1; i < kMaxListedImplementations && pd.next_impl(); ++i)
    if (best == pd.impl_info_str()) return pd;
  return make();
}

// The persistent store of choices (exposed for its tests). machine_identity(): what a choice is valid
// for. choice_cache_path(): the file from SLIMQUANT_TUNING_CACHE and the environment, empty for none.
std::string machine_identity();
std::string choice_cache_path();
// The choices in `path` if its first line is `machine`, else none (a missing, foreign or damaged
// file is never an error: the cache only saves time).
std::unordered_map<std::string, std::string> read_choices(const std::string& path, const std::string& machine);
// Adds key -> name to the file (merged with what another process may have written meanwhile),
// written atomically (write, then rename); silently leaves the file alone when it cannot be written.
void record_choice(const std::string& path, const std::string& machine, const std::string& key, const std::string& name);

// Text for such keys: a memory descriptor (dims, data type, strides and inner blocks); the post-op
// kinds and algorithms of an attribute (their parameters do not change which kernel is fastest).
std::string describe(const dnnl::memory::desc& md);
std::string describe(const dnnl::primitive_attr& attr);

}  // namespace slimquant::runtime::dnnl_kernels
