#include "runtime/kernels/dnnl/implementation_choice.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "runtime/dnnl_context.h"

namespace slimquant::runtime::dnnl_kernels {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;
using cf = dnnl::convolution_forward;

// An int8 3x3 convolution as QConv builds it (u8 src, s8 weights, f32 bias, per-channel output
// scales, ReLU, u8 dst, layouts left to oneDNN).
struct Int8Conv {
  memory::desc src{{4, 16, 14, 14}, dt::u8, tag::any}, wei{{16, 16, 3, 3}, dt::s8, tag::any},
      bias{{16}, dt::f32, tag::a}, dst{{4, 16, 14, 14}, dt::u8, tag::any};
  dnnl::primitive_attr attr;
  // Outlives the descriptors: oneDNN's implementation iterator (next_impl) reads it.
  cf::desc desc{dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src, wei, bias, dst,
                {1, 1}, {1, 1}, {1, 1}};
  Int8Conv() {
    std::vector<float> scales(16);
    for (int c = 0; c < 16; ++c) scales[c] = 0.001f * static_cast<float>(c + 1);
    attr.set_output_scales(1 << 1, scales);
    dnnl::post_ops ops;
    ops.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
    attr.set_post_ops(ops);
  }
  cf::primitive_desc make() const { return cf::primitive_desc(desc, attr, dnnl_engine()); }
};

// Probe inputs: pseudo-random, or the worst case for kernels that add pairs of u8 x s8 products in
// saturating 16-bit lanes (src 255 everywhere, weight pairs (127, 127) then (-64, -64): exact pair
// sums 64770 and -32640, saturated 32767 and -32640; zero bias, so exact outputs saturate high and
// saturated ones stay small).
enum class Fill { kRandom, kSaturatingPairs };

// Runs pd on fixed data given in plain layouts; returns the plain u8 output.
std::vector<uint8_t> run_conv(const cf::primitive_desc& pd, Fill fill, uint32_t seed = 7) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> x(4 * 16 * 14 * 14);
  std::vector<int8_t> w(16 * 16 * 9);
  std::vector<float> b(16);
  if (fill == Fill::kRandom) {
    for (auto& v : x) v = static_cast<uint8_t>(rng() % 256);
    for (auto& v : w) v = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
    for (auto& v : b) v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000);
  } else {
    std::fill(x.begin(), x.end(), uint8_t{255});
    for (size_t o = 0; o < 16; ++o)
      for (size_t i = 0; i < 16; ++i)
        for (size_t k = 0; k < 9; ++k) w[(o * 16 + i) * 9 + k] = (i / 2) % 2 == 0 ? int8_t{127} : int8_t{-64};
  }
  auto& eng = dnnl_engine();
  auto& stream = dnnl_stream();
  memory x_user({{4, 16, 14, 14}, dt::u8, tag::nchw}, eng, x.data());
  memory w_user({{16, 16, 3, 3}, dt::s8, tag::oihw}, eng, w.data());
  memory b_mem(pd.bias_desc(), eng, b.data());
  memory x_mem(pd.src_desc(), eng), w_mem(pd.weights_desc(), eng), y_mem(pd.dst_desc(), eng);
  dnnl::reorder(x_user, x_mem).execute(stream, x_user, x_mem);
  dnnl::reorder(w_user, w_mem).execute(stream, w_user, w_mem);
  memory scratch(pd.scratchpad_desc(), eng);
  cf(pd).execute(stream, {{DNNL_ARG_SRC, x_mem}, {DNNL_ARG_WEIGHTS, w_mem}, {DNNL_ARG_BIAS, b_mem},
                          {DNNL_ARG_DST, y_mem}, {DNNL_ARG_SCRATCHPAD, scratch}});
  std::vector<uint8_t> y(4 * 16 * 14 * 14);
  memory y_user({{4, 16, 14, 14}, dt::u8, tag::nchw}, eng, y.data());
  dnnl::reorder(y_mem, y_user).execute(stream, y_mem, y_user);
  stream.wait();
  return y;
}

// oneDNN's list for a convolution: nth(i) is the descriptor i steps down from make()'s.
std::function<dnnl::primitive_desc(size_t)> listing(std::function<cf::primitive_desc()> make) {
  return [make = std::move(make)](size_t steps) -> dnnl::primitive_desc {
    cf::primitive_desc pd = make();
    for (size_t i = 0; i < steps; ++i)
      if (!pd.next_impl()) return cf::primitive_desc();
    return pd;
  };
}
std::function<dnnl::primitive_desc(size_t)> listing(const Int8Conv& conv) {
  return listing([&conv] { return conv.make(); });
}
std::function<dnnl::primitive_desc(size_t)> listing(const cf::desc& desc) {
  return listing([&desc] { return cf::primitive_desc(desc, dnnl::primitive_attr(), dnnl_engine()); });
}

TEST(ImplementationChoice, NamesTheIsaOfAnImplementation) {
  EXPECT_EQ(implementation_isa("brgconv:avx512_core_vnni"), "avx512_core_vnni");
  EXPECT_EQ(implementation_isa("jit_uni_int8:avx2"), "avx2");
  EXPECT_EQ(implementation_isa("ref:any"), "any");
  EXPECT_EQ(implementation_isa("gemm"), "");
}

// Holds on every CPU: whatever oneDNN lists here (on AMD Zen 4 its avx2 and sse41 int8 kernels,
// which saturate, come right after the VNNI ones), the choice only adopts candidates that compute
// the first choice's numbers, also on the input that separates saturating kernels from exact ones.
TEST(ImplementationChoice, AdoptsOnlyCandidatesWithTheFirstChoicesLayoutsIsaAndResults) {
  const Int8Conv conv;
  const cf::primitive_desc first = conv.make();
  const std::string first_isa = implementation_isa(first.impl_info_str());
  const std::vector<dnnl::primitive_desc> equivalent = equivalent_implementations(listing(conv));
  ASSERT_FALSE(equivalent.empty());
  EXPECT_EQ(std::string(equivalent[0].impl_info_str()), std::string(first.impl_info_str()));
  const std::vector<uint8_t> expected_random = run_conv(first, Fill::kRandom);
  const std::vector<uint8_t> expected_saturating = run_conv(first, Fill::kSaturatingPairs);
  for (const dnnl::primitive_desc& pd : equivalent) {
    const cf::primitive_desc candidate(pd.get());
    const std::string name = candidate.impl_info_str();
    EXPECT_NE(name.rfind("ref", 0), 0u) << name;
    EXPECT_EQ(implementation_isa(name), first_isa) << name;
    EXPECT_TRUE(candidate.src_desc() == first.src_desc()) << name;
    EXPECT_TRUE(candidate.dst_desc() == first.dst_desc()) << name;
    EXPECT_EQ(run_conv(candidate, Fill::kRandom), expected_random) << name << " vs " << first.impl_info_str();
    EXPECT_EQ(run_conv(candidate, Fill::kRandom, 11), run_conv(first, Fill::kRandom, 11)) << name;
    EXPECT_EQ(run_conv(candidate, Fill::kSaturatingPairs), expected_saturating) << name;
  }
  const cf::primitive_desc chosen =
      fastest_implementation<cf::primitive_desc>("test-int8-conv-3x3", [&] { return conv.make(); });
  EXPECT_TRUE(std::any_of(equivalent.begin(), equivalent.end(), [&](const dnnl::primitive_desc& pd) {
    return std::string(pd.impl_info_str()) == chosen.impl_info_str();
  })) << chosen.impl_info_str();
  EXPECT_EQ(run_conv(chosen, Fill::kSaturatingPairs), expected_saturating);
  RecordProperty("equivalent_candidates", static_cast<int>(equivalent.size()));
}

// A float depthwise convolution, blocked layouts: oneDNN lists several kernels for it (on AVX-512
// brdgmm_dw and jit_dw, which sum in other orders, so they differ in the last bits). Those the
// choice may adopt give the first choice's output bit for bit on data other than the probe's.
TEST(ImplementationChoice, FloatCandidatesAdoptedGiveTheFirstChoicesBits) {
  const memory::desc src({4, 32, 14, 14}, dt::f32, tag::any), wei({32, 1, 1, 3, 3}, dt::f32, tag::any),
      bias({32}, dt::f32, tag::a), dst({4, 32, 14, 14}, dt::f32, tag::any);
  const cf::desc desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src, wei, bias, dst,
                      {1, 1}, {1, 1}, {1, 1});
  const auto nth = listing(desc);
  auto run = [](const cf::primitive_desc& pd) {
    std::mt19937 rng(12345);
    std::uniform_real_distribution<float> dist(-3.f, 3.f);
    std::vector<float> x(4 * 32 * 14 * 14), w(32 * 9), b(32), y(x.size());
    for (auto* v : {&x, &w, &b})
      for (auto& e : *v) e = dist(rng);
    auto& eng = dnnl_engine();
    auto& stream = dnnl_stream();
    memory x_user({{4, 32, 14, 14}, dt::f32, tag::nchw}, eng, x.data()), w_user({{32, 1, 1, 3, 3}, dt::f32, tag::goihw}, eng, w.data());
    memory x_mem(pd.src_desc(), eng), w_mem(pd.weights_desc(), eng), y_mem(pd.dst_desc(), eng), b_mem(pd.bias_desc(), eng, b.data());
    dnnl::reorder(x_user, x_mem).execute(stream, x_user, x_mem);
    dnnl::reorder(w_user, w_mem).execute(stream, w_user, w_mem);
    memory scratch(pd.scratchpad_desc(), eng);
    cf(pd).execute(stream, {{DNNL_ARG_SRC, x_mem}, {DNNL_ARG_WEIGHTS, w_mem}, {DNNL_ARG_BIAS, b_mem},
                            {DNNL_ARG_DST, y_mem}, {DNNL_ARG_SCRATCHPAD, scratch}});
    memory y_user({{4, 32, 14, 14}, dt::f32, tag::nchw}, eng, y.data());
    dnnl::reorder(y_mem, y_user).execute(stream, y_mem, y_user);
    stream.wait();
    return y;
  };
  const cf::primitive_desc first(nth(0).get());
  const std::vector<float> expected = run(first);
  const std::vector<dnnl::primitive_desc> equivalent = equivalent_implementations(nth);
  ASSERT_FALSE(equivalent.empty());
  for (const dnnl::primitive_desc& pd : equivalent) {
    const cf::primitive_desc candidate(pd.get());
    const std::vector<float> got = run(candidate);
    EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0)
        << candidate.impl_info_str() << " vs " << first.impl_info_str();
  }
  RecordProperty("equivalent_candidates", static_cast<int>(equivalent.size()));
}

TEST(ImplementationChoice, TimesEachKeyOnce) {
  const Int8Conv conv;
  int listed = 0;
  const auto list = listing(conv);
  auto nth = [&](size_t steps) {
    ++listed;
    return list(steps);
  };
  const std::string first = fastest_implementation_name("test-int8-conv-cache", nth);
  const int after_first = listed;
  EXPECT_GT(after_first, 0);
  EXPECT_EQ(fastest_implementation_name("test-int8-conv-cache", nth), first);
  EXPECT_EQ(listed, after_first);  // answered from the cache
  // Another thread count is another problem: timed once more, then cached too.
  const int threads = omp_get_max_threads();
  omp_set_num_threads(threads + 1);
  fastest_implementation_name("test-int8-conv-cache", nth);
  const int after_second = listed;
  fastest_implementation_name("test-int8-conv-cache", nth);
  omp_set_num_threads(threads);
  EXPECT_GT(after_second, after_first);
  EXPECT_EQ(listed, after_second);
}

TEST(ImplementationChoice, LargeProblemsKeepTheFirstChoiceWithoutTiming) {
  // 64 x 64 x 224 x 224 f32 in and out: 1.6 GB of arguments, never allocated to time candidates.
  const memory::desc src({64, 64, 224, 224}, dt::f32, tag::any), wei({64, 64, 3, 3}, dt::f32, tag::any),
      dst({64, 64, 224, 224}, dt::f32, tag::any);
  const cf::desc desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, src, wei, dst,
                      {1, 1}, {1, 1}, {1, 1});
  const auto nth = listing(desc);
  EXPECT_EQ(fastest_implementation_name("test-f32-conv-huge", nth), "");
}

TEST(ImplementationChoice, DescribesWhatTheKeyNeeds) {
  const memory::desc plain({2, 3}, dt::f32, tag::ab), transposed({2, 3}, dt::f32, tag::ba), u8({2, 3}, dt::u8, tag::ab);
  EXPECT_NE(describe(plain), describe(transposed));
  EXPECT_NE(describe(plain), describe(u8));
  dnnl::primitive_attr relu, none;
  dnnl::post_ops ops;
  ops.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
  relu.set_post_ops(ops);
  EXPECT_NE(describe(relu), describe(none));
}

// The on-disk store: what one process chose, the next reads; a file for another machine, or a
// damaged one, is ignored (and replaced at the next write); another process's entries survive.
TEST(ImplementationChoice, StoreKeepsChoicesPerMachineAndMergesWriters) {
  const std::string dir = ::testing::TempDir() + "/sq_choices_" + std::to_string(::getpid());
  const std::string path = dir + "/nested/dnnl_choices.tsv";
  std::filesystem::remove_all(dir);
  const std::string machine = machine_identity();
  EXPECT_NE(machine.find("oneDNN"), std::string::npos) << machine;
  EXPECT_TRUE(read_choices(path, machine).empty());

  record_choice(path, machine, "conv:a|threads 1", "jit_int8:avx512_core_vnni");  // creates the folders
  record_choice(path, machine, "conv:b|threads 1", "");                           // oneDNN's first choice
  auto choices = read_choices(path, machine);
  ASSERT_EQ(choices.size(), 2u);
  EXPECT_EQ(choices["conv:a|threads 1"], "jit_int8:avx512_core_vnni");
  EXPECT_EQ(choices["conv:b|threads 1"], "");
  EXPECT_TRUE(read_choices(path, machine + " (another CPU)").empty());

  // A key with a line break cannot be stored, and does not damage the file.
  record_choice(path, machine, "bad\nkey", "x");
  EXPECT_EQ(read_choices(path, machine).size(), 2u);

  // Written for another machine: replaced by this one's choices alone.
  record_choice(path, "another machine", "conv:c|threads 2", "brg:avx2");
  EXPECT_TRUE(read_choices(path, machine).empty());
  EXPECT_EQ(read_choices(path, "another machine").size(), 1u);

  // Damaged (a line without a tab): ignored whole.
  { std::ofstream(path) << machine << "\nconv:a|threads 1\n"; }
  EXPECT_TRUE(read_choices(path, machine).empty());
  record_choice(path, machine, "conv:d|threads 1", "jit:avx2");
  EXPECT_EQ(read_choices(path, machine).size(), 1u);

  // Not writable (the path is a folder): the call returns, nothing is thrown.
  std::filesystem::create_directories(dir + "/a_folder");
  EXPECT_NO_THROW(record_choice(dir + "/a_folder", machine, "k", "n"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace slimquant::runtime::dnnl_kernels
