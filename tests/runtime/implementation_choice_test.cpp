#include "runtime/kernels/implementation_choice.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
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

// Runs pd on fixed pseudo-random data given in plain layouts; returns the plain u8 output.
std::vector<uint8_t> run_conv(const cf::primitive_desc& pd) {
  std::mt19937 rng(7);
  std::vector<uint8_t> x(4 * 16 * 14 * 14);
  std::vector<int8_t> w(16 * 16 * 9);
  std::vector<float> b(16);
  for (auto& v : x) v = static_cast<uint8_t>(rng() % 256);
  for (auto& v : w) v = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
  for (auto& v : b) v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000);
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

TEST(ImplementationChoice, KeepsTheFirstChoicesLayoutsAndItsResults) {
  const Int8Conv conv;
  const cf::primitive_desc first = conv.make();
  const cf::primitive_desc chosen =
      fastest_implementation<cf::primitive_desc>("test-int8-conv-3x3", [&] { return conv.make(); });
  EXPECT_NE(std::string(chosen.impl_info_str()).rfind("ref", 0), 0u) << chosen.impl_info_str();
  EXPECT_TRUE(chosen.src_desc() == first.src_desc());
  EXPECT_TRUE(chosen.dst_desc() == first.dst_desc());
  // Every candidate computes the same defined integer arithmetic, bit for bit.
  const std::vector<uint8_t> expected = run_conv(first);
  cf::primitive_desc candidate = conv.make();
  int compared = 0;
  for (size_t i = 0; i < kMaxListedImplementations && candidate.next_impl(); ++i) {
    const std::string name = candidate.impl_info_str();
    if (name.rfind("ref", 0) == 0 || !(candidate.src_desc() == first.src_desc()) ||
        !(candidate.dst_desc() == first.dst_desc()))
      continue;
    EXPECT_EQ(run_conv(candidate), expected) << name << " vs " << first.impl_info_str();
    ++compared;
  }
  EXPECT_EQ(run_conv(chosen), expected);
  RecordProperty("candidates_compared", compared);
}

TEST(ImplementationChoice, TimesEachKeyOnce) {
  const Int8Conv conv;
  int listed = 0;
  auto nth = [&](size_t steps) -> dnnl::primitive_desc {
    ++listed;
    cf::primitive_desc pd = conv.make();
    for (size_t i = 0; i < steps; ++i)
      if (!pd.next_impl()) return cf::primitive_desc();
    return pd;
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
  auto nth = [&](size_t steps) -> dnnl::primitive_desc {
    cf::primitive_desc pd(desc, dnnl::primitive_attr(), dnnl_engine());
    for (size_t i = 0; i < steps; ++i)
      if (!pd.next_impl()) return cf::primitive_desc();
    return pd;
  };
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

}  // namespace
}  // namespace slimquant::runtime::dnnl_kernels
