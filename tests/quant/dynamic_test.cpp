// Dynamic quantization (QuantMode::kDynamic, ONNX Runtime's quantize_dynamic form): per-channel int8
// weights read by MatMulInteger / ConvInteger, activations quantized per inference by
// DynamicQuantizeLinear, no data.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "quant/int8_test_util.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/post_training_quantization.h"
#include "slimquant/quant/precision_fallback.h"
#include "slimquant/quant/ptq.h"
#include "graph_builder.h"

using namespace slimquant;
using test::count_op;

namespace {

Tensor random_tensor(Shape shape, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  Tensor t(DType::kFloat32, std::move(shape));
  std::uniform_real_distribution<float> u(lo, hi);
  for (auto& v : t.values<float>()) v = u(rng);
  return t;
}

using test::float_value;

ir::Node node(const std::string& op, const std::string& name, std::vector<std::string> in, std::vector<std::string> out) {
  ir::Node n;
  n.op_type = op;
  n.name = name;
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  return n;
}

// Conv (bias, stride 2, pads 1) on x; Gemm (transB, alpha, beta, C) and MatMul on the same v (one
// DynamicQuantizeLinear for both); a MatMul of a rank-3 t.
ir::Graph three_layer_kinds() {
  std::mt19937 rng(7);
  ir::Graph g;
  g.name = "dynamic_kinds";
  g.opset = 13;
  g.inputs = {float_value("x", {2, 3, 9, 9}), float_value("v", {5, 6}), float_value("t", {2, 3, 6})};
  g.initializers["conv_w"] = random_tensor({4, 3, 3, 3}, rng);
  g.initializers["conv_b"] = random_tensor({4}, rng);
  g.initializers["gemm_w"] = random_tensor({7, 6}, rng);
  g.initializers["gemm_c"] = random_tensor({7}, rng);
  g.initializers["mm_w"] = random_tensor({6, 4}, rng, -2.f, 3.f);
  g.initializers["mm3_w"] = random_tensor({6, 8}, rng);
  ir::Node conv = node("Conv", "conv", {"x", "conv_w", "conv_b"}, {"c"});
  conv.attrs["pads"] = std::vector<int64_t>{1, 1, 1, 1};
  conv.attrs["strides"] = std::vector<int64_t>{2, 2};
  ir::Node gemm = node("Gemm", "gemm", {"v", "gemm_w", "gemm_c"}, {"gm"});
  gemm.attrs["transB"] = int64_t{1};
  gemm.attrs["alpha"] = 0.5f;
  gemm.attrs["beta"] = 2.f;
  g.nodes = {conv, gemm, node("MatMul", "mm", {"v", "mm_w"}, {"m"}), node("MatMul", "mm3", {"t", "mm3_w"}, {"m3"})};
  g.outputs = {float_value("c", {2, 4, 5, 5}), float_value("gm", {5, 7}), float_value("m", {5, 4}),
               float_value("m3", {2, 3, 8})};
  return g;
}

ir::Graph dynamic_of(const ir::Graph& f) {
  quant::QuantConfig config;
  config.mode = quant::QuantMode::kDynamic;
  quant::PTQ ptq(config);
  ptq.quantize(f);
  return ptq.convert();
}


int argmax_agreement(const Tensor& a, const Tensor& b) {
  int agree = 0;
  for (int64_t r = 0; r < a.dim(0); ++r) {
    const float* x = a.data<float>() + r * a.dim(1);
    const float* y = b.data<float>() + r * b.dim(1);
    agree += std::max_element(x, x + a.dim(1)) - x == std::max_element(y, y + b.dim(1)) - y;
  }
  return agree;
}

Tensor test_images(int64_t count) {
  data::DataOptions d;
  d.spec = "fashion-mnist:test";
  d.limit = static_cast<size_t>(count);
  auto ds = data::open_dataset(d);
  return data::BatchLoader(*ds, static_cast<size_t>(count)).batch(0).inputs;
}

TEST(Dynamic, WritesOnnxRuntimesDynamicFormForConvGemmAndMatMul) {
  const ir::Graph f = three_layer_kinds();
  const ir::Graph g = dynamic_of(f);
  EXPECT_EQ(g.metadata.at("slimquant.mode"), "dynamic");
  EXPECT_EQ(g.metadata.at("slimquant.weight_bits"), "8");
  EXPECT_EQ(count_op(g, "DynamicQuantizeLinear"), 3) << "x, v (shared by the Gemm and the MatMul), t";
  EXPECT_EQ(count_op(g, "ConvInteger"), 1);
  EXPECT_EQ(count_op(g, "MatMulInteger"), 3);
  EXPECT_EQ(count_op(g, "Cast"), 4);
  EXPECT_EQ(count_op(g, "Add"), 2) << "Conv's bias and Gemm's C";
  for (const char* gone : {"Conv", "Gemm", "MatMul", "QuantizeLinear", "DequantizeLinear"}) EXPECT_EQ(count_op(g, gone), 0) << gone;
  for (const char* gone : {"conv_w", "gemm_w", "mm_w", "conv_b", "gemm_c"}) EXPECT_EQ(g.initializer(gone), nullptr) << gone;
  for (const auto& n : g.nodes) {
    if (n.op_type == "ConvInteger") {
      // u8 = s8 + 128 with one zero point 128: ONNX Runtime 1.20 has no s8-weight ConvInteger.
      const Tensor& w = *g.initializer(n.inputs[1]);
      const Tensor& zp = *g.initializer(n.inputs[3]);
      EXPECT_EQ(w.dtype(), DType::kUInt8);
      EXPECT_EQ(zp.numel(), 1);
      EXPECT_EQ(zp.data<uint8_t>()[0], 128);
      int lo = 255, hi = 0;
      for (uint8_t v : w.values<uint8_t>()) lo = std::min<int>(lo, v), hi = std::max<int>(hi, v);
      EXPECT_GE(lo, 1);
      EXPECT_LE(hi, 255);
      EXPECT_TRUE(lo == 1 || hi == 255) << "some channel's max |w| maps to 127";
      EXPECT_EQ(n.attr_ints("strides"), (std::vector<int64_t>{2, 2}));
      EXPECT_EQ(n.attr_ints("pads"), (std::vector<int64_t>{1, 1, 1, 1}));
    }
    if (n.op_type == "MatMulInteger") {
      const Tensor& w = *g.initializer(n.inputs[1]);
      const Tensor& zp = *g.initializer(n.inputs[3]);
      EXPECT_EQ(w.dtype(), DType::kInt8);
      EXPECT_EQ(zp.dtype(), DType::kInt8);
      EXPECT_EQ(zp.numel(), w.dim(1)) << "one zero point (0) per column";
      for (int8_t z : zp.values<int8_t>()) EXPECT_EQ(z, 0);
    }
  }
  // The Gemm's weight is alpha * W^T as [K, N]; its scale per column.
  const Tensor& gw = *g.initializer("gemm_w_quantized");
  EXPECT_EQ(gw.shape(), (Shape{6, 7}));
  EXPECT_EQ(g.initializer("gemm_w_scale")->numel(), 7);
  EXPECT_EQ(g.initializer("conv_w_scale")->shape(), (Shape{1, 4, 1, 1}));

  // Numbers: every output within the rounding of 8-bit activations and weights of the float one.
  std::mt19937 rng(11);
  const std::map<std::string, Tensor> feeds = {
      {"x", random_tensor({2, 3, 9, 9}, rng)}, {"v", random_tensor({5, 6}, rng, -0.5f, 2.f)}, {"t", random_tensor({2, 3, 6}, rng)}};
  const auto reference = runtime::Session(f).run(feeds);
  const auto dynamic = runtime::Session(g).run(feeds);
  for (const char* out : {"c", "gm", "m", "m3"}) {
    const Tensor& a = reference.at(out);
    const Tensor& b = dynamic.at(out);
    ASSERT_EQ(a.shape(), b.shape()) << out;
    float worst = 0, range = 0;
    for (int64_t i = 0; i < a.numel(); ++i) {
      worst = std::max(worst, std::abs(a.data<float>()[i] - b.data<float>()[i]));
      range = std::max(range, std::abs(a.data<float>()[i]));
    }
    EXPECT_LT(worst, 0.03f * range) << out;
    EXPECT_GT(worst, 0.f) << out << ": the integers are used";
  }
  // A file ONNX's checker accepts.
  test::TempDir tmp("dynamic_kinds");
  ir::save_onnx(g, tmp.path("d.onnx"));
  EXPECT_EQ(ir::load_onnx(tmp.path("d.onnx")).nodes.size(), g.nodes.size());
}

// No data, and the fixtures' argmax agrees with FP32 on the test images (a convolutional network
// and a transformer).
TEST(Dynamic, FixturesAgreeWithFp32WithoutData) {
  const Tensor images = test_images(64);
  for (const char* model : {"resnet_small", "vit_small"}) {
    quant::PostTrainingQuantizationOptions o;
    o.model_dir = test::fixture_model(model);
    o.mode = "dynamic";
    quant::PostTrainingQuantization ptq(o);
    const ir::Graph& g = ptq.quantize();
    EXPECT_EQ(ptq.report().batches, 0u);
    EXPECT_GT(count_op(g, "MatMulInteger") + count_op(g, "ConvInteger"), 0) << model;
    EXPECT_EQ(count_op(g, "Conv") + count_op(g, "Gemm"), 0) << model;
    const std::map<std::string, Tensor> feeds = {{"input", images}};
    const auto reference = runtime::Session(ptq.ptq().float_graph()).run(feeds);
    const auto dynamic = runtime::Session(g).run(feeds);
    EXPECT_GE(argmax_agreement(reference.at("logits"), dynamic.at("logits")), 62) << model;
    EXPECT_GT(quant::output_sqnr_db(reference, dynamic), 20.0) << model;
  }
}

}  // namespace
