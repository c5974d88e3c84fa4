#include "runtime/kernels/dnnl/implementation_choice.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include <omp.h>

#include "runtime/dnnl_context.h"
#include "slimquant/core/atomic_file.h"
#include "slimquant/core/error.h"

namespace slimquant::runtime::dnnl_kernels {

namespace {

// Another candidate replaces oneDNN's first choice only when it takes at most this share of its time.
constexpr double kRequiredSpeedup = 0.85;
// Problems whose src + dst + weights exceed this are not timed.
constexpr size_t kMaxTimedBytes = size_t{64} << 20;

// SLIMQUANT_DNNL_TUNING: 0 keeps oneDNN's first choice; "alternative" adopts the last candidate
// proven equivalent regardless of speed (tests use it to show that the choice never changes a
// result); anything else times the equivalent candidates.
enum class Tuning { kOff, kTimed, kPreferAlternative };

Tuning tuning_mode() {
  static const Tuning mode = [] {
    const char* v = std::getenv("SLIMQUANT_DNNL_TUNING");
    if (v && std::strcmp(v, "0") == 0) return Tuning::kOff;
    if (v && std::strcmp(v, "alternative") == 0) return Tuning::kPreferAlternative;
    return Tuning::kTimed;
  }();
  return mode;
}

// Row-major strides for dims (the plain layout probe data is written in).
dnnl::memory::desc plain_desc(const dnnl::memory::desc& md) {
  const dnnl::memory::dims dims = md.dims();
  dnnl::memory::dims strides(dims.size(), 1);
  for (size_t i = dims.size(); i-- > 1;) strides[i - 1] = strides[i] * dims[i];
  return dnnl::memory::desc(dims, md.data_type(), strides);
}

// Deterministic pseudo-random contents for a plain buffer of `md`'s data type, the same for every
// candidate (seeded by the argument): full-range integers (every u8 x s8 pair sum that saturates a
// 16-bit lane shows), floats with varied exponents (every change of summation order shows). False
// for data types the probe does not know: such candidates are never adopted.
bool fill_probe(const dnnl::memory::desc& md, std::vector<std::byte>& bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t n = md.get_size();
  bytes.assign(n, std::byte{0});
  using dt = dnnl::memory::data_type;
  switch (md.data_type()) {
    case dt::u8:
    case dt::s8:
      for (auto& b : bytes) b = static_cast<std::byte>(rng() & 0xff);
      return true;
    case dt::s32: {
      std::uniform_int_distribution<int32_t> dist(-1000, 1000);
      for (size_t i = 0; i + 4 <= n; i += 4) {
        const int32_t v = dist(rng);
        std::memcpy(&bytes[i], &v, 4);
      }
      return true;
    }
    case dt::f32: {
      std::uniform_real_distribution<float> mantissa(-1.f, 1.f);
      std::uniform_int_distribution<int> exponent(-8, 8);
      for (size_t i = 0; i + 4 <= n; i += 4) {
        const float v = std::ldexp(mantissa(rng), exponent(rng));
        std::memcpy(&bytes[i], &v, 4);
      }
      return true;
    }
    default:
      return false;
  }
}

// The arguments a candidate reads (destination included: a sum post-op reads it first).
std::vector<int> input_args(const dnnl::primitive_desc& pd) {
  std::vector<int> args = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_BIAS, DNNL_ARG_DST};
  // get_post_ops() views the attribute's storage: keep the attribute alive while reading it.
  const dnnl::primitive_attr attr = pd.get_primitive_attr();
  const dnnl::post_ops ops = attr.get_post_ops();
  for (int i = 0; i < ops.len(); ++i)
    if (ops.kind(i) == dnnl::primitive::kind::binary) args.push_back(DNNL_ARG_ATTR_MULTIPLE_POST_OP(i) | DNNL_ARG_SRC_1);
  return args;
}

// Runs pd on the probe data (given in plain layouts, reordered into pd's own, so each candidate's
// weight blocking and compensation are built as in use) and returns its plain-layout destination;
// nullopt when the probe cannot run it.
std::optional<std::vector<std::byte>> probe_output(const dnnl::primitive_desc& pd) {
  try {
    dnnl::engine& engine = dnnl_engine();
    dnnl::stream& stream = dnnl_stream();
    std::vector<std::vector<std::byte>> storage;
    storage.reserve(16);
    std::unordered_map<int, dnnl::memory> args;
    auto own = [&](const dnnl::memory::desc& md) {
      storage.emplace_back(md.get_size(), std::byte{0});
      return dnnl::memory(md, engine, storage.back().data());
    };
    for (int arg : input_args(pd)) {
      const dnnl::memory::desc md = pd.query_md(dnnl::query::exec_arg_md, arg);
      if (md.is_zero()) continue;
      const dnnl::memory::desc plain = plain_desc(md);
      storage.emplace_back();
      if (!fill_probe(plain, storage.back(), 0x5eed0000u + static_cast<uint32_t>(arg))) return std::nullopt;
      dnnl::memory user(plain, engine, storage.back().data());
      dnnl::memory mem = own(md);
      dnnl::reorder(user, mem).execute(stream, user, mem);
      args.emplace(arg, mem);
    }
    const dnnl::memory::desc zp_md({1}, dnnl::memory::data_type::s32, dnnl::memory::format_tag::x);
    for (int arg : {DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST})
      args.emplace(arg, own(zp_md));
    const dnnl::memory::desc scratch = pd.query_md(dnnl::query::exec_arg_md, DNNL_ARG_SCRATCHPAD);
    if (!scratch.is_zero()) args.emplace(DNNL_ARG_SCRATCHPAD, own(scratch));
    const auto dst = args.find(DNNL_ARG_DST);
    if (dst == args.end()) return std::nullopt;
    dnnl::primitive(pd).execute(stream, args);
    const dnnl::memory::desc plain = plain_desc(dst->second.get_desc());
    std::vector<std::byte> out(plain.get_size());
    dnnl::memory user(plain, engine, out.data());
    dnnl::reorder(dst->second, user).execute(stream, dst->second, user);
    stream.wait();
    return out;
  } catch (const dnnl::error&) {
    return std::nullopt;
  }
}

// One candidate ready to run on zero-filled arguments.
struct Candidate {
  std::string name;
  dnnl::primitive prim;
  std::vector<std::vector<std::byte>> buffers;
  std::unordered_map<int, dnnl::memory> args;
  double best = std::numeric_limits<double>::infinity();

  Candidate(std::string impl, const dnnl::primitive_desc& pd) : name(std::move(impl)), prim(pd) {
    for (int arg : input_args(pd)) bind(arg, pd.query_md(dnnl::query::exec_arg_md, arg));
    bind(DNNL_ARG_SCRATCHPAD, pd.query_md(dnnl::query::exec_arg_md, DNNL_ARG_SCRATCHPAD));
    // Run-time zero points (a primitive that takes none ignores them).
    const dnnl::memory::desc zp_md({1}, dnnl::memory::data_type::s32, dnnl::memory::format_tag::x);
    for (int arg : {DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST})
      bind(arg, zp_md);
  }
  void bind(int arg, const dnnl::memory::desc& md) {
    if (md.is_zero() || args.count(arg)) return;
    buffers.emplace_back(md.get_size(), std::byte{0});
    args.emplace(arg, dnnl::memory(md, dnnl_engine(), buffers.back().data()));
  }
  double run() {
    dnnl::stream& stream = dnnl_stream();
    const auto t0 = std::chrono::steady_clock::now();
    prim.execute(stream, args);
    stream.wait();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

// The candidates run in turns and each keeps its fastest run: on a machine shared with other work,
// interruptions only ever add time, and taking turns exposes every candidate to the same load.
// Small problems get up to ~4 ms of rounds (at least 3); large ones, whose runs vary little, one
// round, and huge ones only their first run, so that choosing never costs more than a few runs.
void time_in_turns(std::vector<Candidate>& candidates) {
  double round_seconds = 0;
  for (auto& c : candidates) {
    c.best = c.run();  // also the first touch of the buffers and caches
    round_seconds += c.best;
  }
  constexpr double kBudgetSeconds = 4e-3, kLargeRoundSeconds = 20e-3, kHugeRoundSeconds = 100e-3;
  const int rounds = round_seconds > kHugeRoundSeconds    ? 0
                     : round_seconds > kLargeRoundSeconds ? 1
                                                          : std::clamp(static_cast<int>(kBudgetSeconds / round_seconds), 3, 20);
  for (int round = 0; round < rounds; ++round)
    for (auto& c : candidates) c.best = std::min(c.best, c.run());
}

}  // namespace

std::string implementation_isa(const std::string& name) {
  const size_t colon = name.rfind(':');
  return colon == std::string::npos ? std::string() : name.substr(colon + 1);
}

std::vector<dnnl::primitive_desc> equivalent_implementations(
    const std::function<dnnl::primitive_desc(size_t)>& nth) {
  std::vector<dnnl::primitive_desc> chosen;
  std::vector<std::string> names;
  std::optional<std::vector<std::byte>> reference;
  dnnl::memory::desc first_src, first_dst;
  std::string first_isa;
  for (size_t i = 0; i < kMaxListedImplementations && chosen.size() < kMaxTimedImplementations; ++i) {
    const dnnl::primitive_desc pd = nth(i);
    if (!pd) break;
    const std::string name = pd.impl_info_str();
    if (i == 0) {
      chosen.push_back(pd);
      names.push_back(name);
      first_src = pd.query_md(dnnl::query::src_md);
      first_dst = pd.query_md(dnnl::query::dst_md);
      first_isa = implementation_isa(name);
      // Timing needs its own arguments for every candidate: not for problems this large (a
      // batch-64 224x224 calibration would allocate gigabytes), which keep oneDNN's choice.
      if (name.rfind("ref", 0) == 0 ||
          first_src.get_size() + first_dst.get_size() + pd.query_md(dnnl::query::weights_md).get_size() > kMaxTimedBytes)
        break;
      continue;
    }
    if (name.rfind("ref", 0) == 0 || std::find(names.begin(), names.end(), name) != names.end()) continue;
    // Only candidates that read and write the layouts of oneDNN's first choice: the plan decides
    // which values stay blocked from that choice, and a candidate that is faster alone can cost
    // more in reorders around it (measured: MobileNetV2's f32 convs, 1.55 -> 1.8-2.5 ms).
    if (pd.query_md(dnnl::query::src_md) != first_src || pd.query_md(dnnl::query::dst_md) != first_dst) continue;
    // Only the first choice's ISA: oneDNN's int8 kernels for ISAs without VNNI (avx2, sse41,
    // avx512_core) add pairs of u8 x s8 products in saturating 16-bit lanes, so on a VNNI CPU they
    // compute other numbers (seen on AMD Zen 4, where jit_uni_int8:avx2 can time faster).
    if (implementation_isa(name) != first_isa) continue;
    // And only what computes the first choice's result bit for bit on the probe data (kernels of
    // one ISA can still sum floats in another order): the choice may change speed, never results.
    if (!reference) reference = probe_output(chosen[0]);
    if (!reference) break;
    const std::optional<std::vector<std::byte>> result = probe_output(pd);
    if (!result || *result != *reference) continue;
    chosen.push_back(pd);
    names.push_back(name);
  }
  return chosen;
}

std::string machine_identity() {
  std::string model = "unknown CPU";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) model = line.substr(line.find_first_not_of(' ', colon + 1));
      break;
    }
  }
  const dnnl_version_t* v = dnnl_version();
  return "slimquant dnnl choices v1 | " + model + " | isa " +
         std::to_string(static_cast<unsigned>(dnnl::get_effective_cpu_isa())) + " | oneDNN " +
         std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) + " " + v->hash;
}

std::string choice_cache_path() {
  if (const char* chosen = std::getenv("SLIMQUANT_TUNING_CACHE"))
    return std::strcmp(chosen, "0") == 0 ? std::string() : std::string(chosen);
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && *xdg) return std::string(xdg) + "/slimquant/dnnl_choices.tsv";
  const char* home = std::getenv("HOME");
  if (home && *home) return std::string(home) + "/.cache/slimquant/dnnl_choices.tsv";
  return {};
}

std::unordered_map<std::string, std::string> read_choices(const std::string& path, const std::string& machine) {
  std::unordered_map<std::string, std::string> choices;
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line) || line != machine) return choices;
  while (std::getline(in, line)) {
    const size_t tab = line.find('\t');
    if (tab == std::string::npos) return {};  // damaged: start again
    choices[line.substr(0, tab)] = line.substr(tab + 1);
  }
  return choices;
}

void record_choice(const std::string& path, const std::string& machine, const std::string& key, const std::string& name) {
  if (path.empty() || key.find_first_of("\t\n") != std::string::npos || name.find_first_of("\t\n") != std::string::npos)
    return;
  std::unordered_map<std::string, std::string> choices = read_choices(path, machine);
  choices[key] = name;
  std::vector<std::pair<std::string, std::string>> sorted(choices.begin(), choices.end());
  std::sort(sorted.begin(), sorted.end());
  std::string text = machine + "\n";
  for (const auto& [k, n] : sorted) text += k + "\t" + n + "\n";
  try {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
    write_file_atomic(path, text);
  } catch (const Error&) {
    // A read-only home or a full disk: the choice stays in this process's memory.
  }
}

std::string fastest_implementation_name(const std::string& problem,
                                        const std::function<dnnl::primitive_desc(size_t)>& nth) {
  const Tuning mode = tuning_mode();
  if (mode == Tuning::kOff) return {};
  static std::mutex mutex;
  static std::unordered_map<std::string, std::string> cache;
  static const std::string machine = machine_identity();
  static const std::string cache_path = mode == Tuning::kTimed ? choice_cache_path() : std::string();
  static bool loaded = false;
  // The fastest implementation can depend on how many threads run it (sessions may differ).
  const std::string key = problem + "|threads " + std::to_string(omp_get_max_threads());
  {
    std::lock_guard lock(mutex);
    if (!loaded && !cache_path.empty()) cache = read_choices(cache_path, machine);
    loaded = true;
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  const std::vector<dnnl::primitive_desc> equivalent = equivalent_implementations(nth);
  std::string best_name;
  if (equivalent.size() > 1 && mode == Tuning::kPreferAlternative) {
    best_name = equivalent.back().impl_info_str();
  } else if (equivalent.size() > 1) {
    std::vector<Candidate> candidates;
    try {
      for (const auto& pd : equivalent) candidates.emplace_back(pd.impl_info_str(), pd);
      time_in_turns(candidates);
    } catch (const dnnl::error&) {
      candidates.clear();  // keep oneDNN's choice
    }
    // oneDNN's first choice (candidates[0]) stays unless another is clearly faster: near-ties
    // measured alone say little about the run in place (other caches, other neighbours), and
    // keeping the default on them keeps choices stable from one process to the next.
    if (!candidates.empty()) {
      const Candidate* best = &candidates[0];
      for (const auto& c : candidates)
        if (c.best < best->best && c.best < candidates[0].best * kRequiredSpeedup) best = &c;
      best_name = best->name;
    }
  }
  std::lock_guard lock(mutex);
  cache.emplace(key, best_name);
  record_choice(cache_path, machine, key, best_name);
  return best_name;
}

std::string describe(const dnnl::memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  std::string s = std::to_string(static_cast<int>(d.data_type)) + ":";
  for (int i = 0; i < d.ndims; ++i) s += std::to_string(d.dims[i]) + (i + 1 < d.ndims ? "x" : "");
  s += ":" + std::to_string(static_cast<int>(d.format_kind));
  if (d.format_kind == dnnl_blocked) {
    const auto& b = d.format_desc.blocking;
    s += ":s";
    for (int i = 0; i < d.ndims; ++i) s += std::to_string(b.strides[i]) + ",";
    s += "b";
    for (int i = 0; i < b.inner_nblks; ++i) s += std::to_string(b.inner_idxs[i]) + "/" + std::to_string(b.inner_blks[i]) + ",";
  }
  return s;
}

std::string describe(const dnnl::primitive_attr& attr) {
  const dnnl::post_ops ops = attr.get_post_ops();
  std::string s = "po";
  for (int i = 0; i < ops.len(); ++i) {
    s += ':';  // appended apart: GCC 12 warns falsely (-Wstringop-overflow) on ":" + std::string
    s += std::to_string(static_cast<int>(ops.kind(i)));
    if (ops.kind(i) == dnnl::primitive::kind::eltwise) {
      float scale = 0, alpha = 0, beta = 0;
      dnnl::algorithm alg;
      ops.get_params_eltwise(i, scale, alg, alpha, beta);
      s += "/" + std::to_string(static_cast<int>(alg));
    }
  }
  return s;
}

}  // namespace slimquant::runtime::dnnl_kernels
