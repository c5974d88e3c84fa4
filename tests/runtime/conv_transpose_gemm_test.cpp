// ConvTranspose with constant weights runs as one GEMM plus a scatter (kernel == strides: DBNet's
// upsampling head) or a col2im accumulation (overlapping kernels, pads, dilations, output padding
// or shape); both must give oneDNN's deconvolution result (the path a run-time weight still takes).
#include <gtest/gtest.h>

#include <random>

#include "slimquant/runtime/session.h"
#include "graph_builder.h"

using namespace slimquant;
using test::random_tensor;

namespace {

// y = ConvTranspose(x, W, B) with W (and B) constants, or W fed at run time; kernel == strides = k
// unless `attrs` gives the window.
ir::Graph conv_transpose_graph(const Tensor& w, const Tensor* b, bool constant_weight, int64_t k,
                               const std::map<std::string, ir::AttributeValue>& attrs = {}) {
  ir::Graph g;
  g.opset = 13;
  g.inputs.push_back({"x", DType::kFloat32, std::nullopt});
  if (!constant_weight) g.inputs.push_back({"w", DType::kFloat32, std::nullopt});
  else g.initializers["w"] = w;
  ir::Node n;
  n.op_type = "ConvTranspose";
  n.name = "up";
  n.inputs = {"x", "w"};
  if (b) {
    g.initializers["b"] = *b;
    n.inputs.push_back("b");
  }
  n.outputs = {"y"};
  n.attrs["strides"] = std::vector<int64_t>{k, k};
  n.attrs["kernel_shape"] = std::vector<int64_t>{k, k};
  if (!attrs.empty()) n.attrs = attrs;
  g.nodes.push_back(n);
  g.outputs.push_back({"y", DType::kFloat32, std::nullopt});
  return g;
}

// y -> act -> z, the graph's output.
ir::Graph with_activation(ir::Graph g, const char* act) {
  ir::Node a;
  a.op_type = act;
  a.name = "act";
  a.inputs = {"y"};
  a.outputs = {"z"};
  g.nodes.push_back(a);
  g.outputs[0].name = "z";
  return g;
}
}  // namespace

TEST(ConvTransposeGemm, KernelSizedStrideMatchesTheDeconvolution) {
  std::mt19937 rng(4);
  struct Case {
    int64_t n, c, m, k, h, w;
    bool bias;
  };
  for (const Case& t : {Case{1, 24, 1, 2, 9, 11, true}, Case{2, 3, 5, 2, 4, 6, false}, Case{1, 4, 3, 3, 5, 4, true}}) {
    SCOPED_TRACE(std::to_string(t.c) + "->" + std::to_string(t.m) + " k" + std::to_string(t.k));
    const Tensor w = random_tensor({t.c, t.m, t.k, t.k}, rng), b = random_tensor({t.m}, rng);
    const Tensor x = random_tensor({t.n, t.c, t.h, t.w}, rng);
    const Tensor* bias = t.bias ? &b : nullptr;
    runtime::Session gemm(conv_transpose_graph(w, bias, true, t.k)), deconv(conv_transpose_graph(w, bias, false, t.k));
    const Tensor got = gemm.run({{"x", x}}).at("y"), want = deconv.run({{"x", x}, {"w", w}}).at("y");
    ASSERT_EQ(got.shape(), (Shape{t.n, t.m, t.h * t.k, t.w * t.k}));
    ASSERT_EQ(got.shape(), want.shape());
    for (int64_t i = 0; i < got.numel(); ++i) EXPECT_NEAR(got.data<float>()[i], want.data<float>()[i], 1e-5f) << i;
  }
}

// A fused activation (Relu after DBNet's folded BatchNorm, Sigmoid at its output) runs inside the
// GEMM path; oneDNN's deconvolution with the same activation as a post-op (W fed at run time)
// gives the reference.
TEST(ConvTransposeGemm, FusedActivationMatchesTheDeconvolutionPostOp) {
  std::mt19937 rng(5);
  for (const char* act : {"Relu", "Sigmoid"}) {
    for (const int64_t k : {2, 3}) {
      SCOPED_TRACE(std::string(act) + " k" + std::to_string(k));
      const int64_t c = 6, m = 4, h = 5, wd = 7;
      const Tensor w = random_tensor({c, m, k, k}, rng), b = random_tensor({m}, rng);
      const Tensor x = random_tensor({1, c, h, wd}, rng);
      runtime::Session gemm(with_activation(conv_transpose_graph(w, &b, true, k), act)),
          deconv(with_activation(conv_transpose_graph(w, &b, false, k), act));
      const Tensor got = gemm.run({{"x", x}}).at("z"), want = deconv.run({{"x", x}, {"w", w}}).at("z");
      ASSERT_EQ(got.shape(), (Shape{1, m, h * k, wd * k}));
      ASSERT_EQ(got.shape(), want.shape());
      int negatives = 0;
      for (int64_t i = 0; i < got.numel(); ++i) {
        EXPECT_NEAR(got.data<float>()[i], want.data<float>()[i], 1e-5f) << i;
        negatives += got.data<float>()[i] < 0.f;
      }
      EXPECT_EQ(negatives, 0);  // the activation was applied
    }
  }
}

// Overlapping windows: every geometry the ONNX operator has (pads, output_padding, dilations,
// auto_pad, an output_shape beyond the natural size, non-square kernels and strides, stride 1),
// with and without bias and a fused Relu, against oneDNN's deconvolution.
TEST(ConvTransposeGemm, OverlappingKernelsMatchTheDeconvolution) {
  std::mt19937 rng(6);
  using Attrs = std::map<std::string, ir::AttributeValue>;
  using V = std::vector<int64_t>;
  struct Case {
    const char* name;
    int64_t kh, kw;
    Attrs attrs;
    Shape out;  // spatial output for a 5x7 input
  };
  const std::vector<Case> cases = {
      {"k4 s2 p1 (GAN upsampling)", 4, 4, {{"strides", V{2, 2}}, {"pads", V{1, 1, 1, 1}}}, {10, 14}},
      {"k3 s2 p1 output_padding 1", 3, 3, {{"strides", V{2, 2}}, {"pads", V{1, 1, 1, 1}}, {"output_padding", V{1, 1}}}, {10, 14}},
      {"k3 s1 p1", 3, 3, {{"pads", V{1, 1, 1, 1}}}, {5, 7}},
      {"k3 s2 dilation 2", 3, 3, {{"strides", V{2, 2}}, {"dilations", V{2, 2}}}, {13, 17}},
      {"k3 s2 SAME_UPPER", 3, 3, {{"strides", V{2, 2}}, {"auto_pad", std::string("SAME_UPPER")}}, {10, 14}},
      {"k3 s2 output_shape beyond", 3, 3, {{"strides", V{2, 2}}, {"output_shape", V{12, 16}}}, {12, 16}},
      {"k3x2 s2x1 pads 1,0", 3, 2, {{"strides", V{2, 1}}, {"pads", V{1, 0, 1, 0}}}, {9, 8}},
  };
  for (const Case& t : cases)
    for (const bool bias : {false, true})
      for (const bool relu : {false, true}) {
        SCOPED_TRACE(std::string(t.name) + (bias ? " bias" : "") + (relu ? " relu" : ""));
        const int64_t c = 6, m = 5;
        const Tensor w = random_tensor({c, m, t.kh, t.kw}, rng), b = random_tensor({m}, rng);
        const Tensor x = random_tensor({2, c, 5, 7}, rng);
        auto graph = [&](bool constant_weight) {
          ir::Graph g = conv_transpose_graph(w, bias ? &b : nullptr, constant_weight, 0, t.attrs);
          return relu ? with_activation(std::move(g), "Relu") : g;
        };
        const std::string out = relu ? "z" : "y";
        runtime::Session gemm(graph(true)), deconv(graph(false));
        const Tensor got = gemm.run({{"x", x}}).at(out), want = deconv.run({{"x", x}, {"w", w}}).at(out);
        ASSERT_EQ(got.shape(), (Shape{2, m, t.out[0], t.out[1]}));
        ASSERT_EQ(got.shape(), want.shape());
        for (int64_t i = 0; i < got.numel(); ++i) EXPECT_NEAR(got.data<float>()[i], want.data<float>()[i], 1e-5f) << i;
      }
}
