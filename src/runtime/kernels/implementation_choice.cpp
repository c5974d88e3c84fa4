#include "runtime/kernels/implementation_choice.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <omp.h>

#include "runtime/dnnl_context.h"

namespace slimquant::runtime::dnnl_kernels {

namespace {

// Another candidate replaces oneDNN's first choice only when it takes at most this share of its time.
constexpr double kRequiredSpeedup = 0.85;
// Problems whose src + dst + weights exceed this are not timed.
constexpr size_t kMaxTimedBytes = size_t{64} << 20;

bool tuning_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("SLIMQUANT_DNNL_TUNING");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return enabled;
}

// One candidate ready to run on zero-filled arguments.
struct Candidate {
  std::string name;
  dnnl::primitive prim;
  std::vector<std::vector<std::byte>> buffers;
  std::unordered_map<int, dnnl::memory> args;
  double best = std::numeric_limits<double>::infinity();

  Candidate(std::string impl, const dnnl::primitive_desc& pd) : name(std::move(impl)), prim(pd) {
    for (int arg : {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_BIAS, DNNL_ARG_DST, DNNL_ARG_SCRATCHPAD})
      bind(arg, pd.query_md(dnnl::query::exec_arg_md, arg));
    // get_post_ops() views the attribute's storage: keep the attribute alive while reading it.
    const dnnl::primitive_attr attr = pd.get_primitive_attr();
    const dnnl::post_ops ops = attr.get_post_ops();
    for (int i = 0; i < ops.len(); ++i)
      if (ops.kind(i) == dnnl::primitive::kind::binary) {
        const int arg = DNNL_ARG_ATTR_MULTIPLE_POST_OP(i) | DNNL_ARG_SRC_1;
        bind(arg, pd.query_md(dnnl::query::exec_arg_md, arg));
      }
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

std::string fastest_implementation_name(const std::string& problem,
                                        const std::function<dnnl::primitive_desc(size_t)>& nth) {
  if (!tuning_enabled()) return {};
  static std::mutex mutex;
  static std::unordered_map<std::string, std::string> chosen;
  // The fastest implementation can depend on how many threads run it (sessions may differ).
  const std::string key = problem + "|threads " + std::to_string(omp_get_max_threads());
  {
    std::lock_guard lock(mutex);
    if (auto it = chosen.find(key); it != chosen.end()) return it->second;
  }
  // oneDNN can list several variants under one name (its brgemm convolutions): the first of each.
  std::vector<Candidate> candidates;
  candidates.reserve(kMaxTimedImplementations);
  dnnl::memory::desc first_src, first_dst;
  for (size_t i = 0; i < kMaxListedImplementations && candidates.size() < kMaxTimedImplementations; ++i) {
    const dnnl::primitive_desc pd = nth(i);
    if (!pd) break;
    const std::string name = pd.impl_info_str();
    if (name.rfind("ref", 0) == 0 ||
        std::any_of(candidates.begin(), candidates.end(), [&](const Candidate& c) { return c.name == name; }))
      continue;
    // Only candidates that read and write the layouts of oneDNN's first choice: the plan decides
    // which values stay blocked from that choice, and a candidate that is faster alone can cost
    // more in reorders around it (measured: MobileNetV2's f32 convs, 1.55 -> 1.8-2.5 ms).
    if (i == 0) {
      first_src = pd.query_md(dnnl::query::src_md);
      first_dst = pd.query_md(dnnl::query::dst_md);
      // Timing needs its own arguments for every candidate: not for problems this large (a
      // batch-64 224x224 calibration would allocate gigabytes), which keep oneDNN's choice.
      if (first_src.get_size() + first_dst.get_size() + pd.query_md(dnnl::query::weights_md).get_size() >
          kMaxTimedBytes)
        break;
    } else if (pd.query_md(dnnl::query::src_md) != first_src || pd.query_md(dnnl::query::dst_md) != first_dst) {
      continue;
    }
    try {
      candidates.emplace_back(name, pd);
    } catch (const dnnl::error&) {
      // a candidate that cannot be created here is simply not chosen
    }
  }
  std::string best_name;
  if (candidates.size() > 1) {
    try {
      time_in_turns(candidates);
    } catch (const dnnl::error&) {
      for (auto& c : candidates) c.best = std::numeric_limits<double>::infinity();  // keep oneDNN's choice
    }
    // oneDNN's first choice (candidates[0]) stays unless another is clearly faster: near-ties
    // measured alone say little about the run in place (other caches, other neighbours), and
    // keeping the default on them keeps choices stable from one process to the next.
    const Candidate* best = &candidates[0];
    for (const auto& c : candidates)
      if (c.best < best->best && c.best < candidates[0].best * kRequiredSpeedup) best = &c;
    best_name = best->name;
  }
  std::lock_guard lock(mutex);
  chosen.emplace(key, best_name);
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
    s += ":" + std::to_string(static_cast<int>(ops.kind(i)));
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
