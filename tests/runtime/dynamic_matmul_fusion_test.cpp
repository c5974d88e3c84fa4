// The fused dynamically quantized MatMul (fusions/dynamic_matmul_fusion.cpp,
// kernels/integer/dynamic_matmul.cpp): the quantize_dynamic chain DynamicQuantizeLinear ->
// MatMulInteger -> Cast -> Mul (-> Add) runs as one node whose output equals the op-by-op
// execution's and the closed form's.
#include <gtest/gtest.h>

#include <cstdlib>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "graph_builder.h"
#include "runtime/fusions/execution_fusions.h"
#include "runtime/kernels/elementwise/gelu_avx512.h"
#include "runtime/kernels/integer/int8_common.h"
#include "slimquant/runtime/session.h"

using namespace slimquant;

namespace {

ir::Node node(const std::string& op, std::vector<std::string> in, std::vector<std::string> out) {
  ir::Node n;
  n.op_type = op;
  n.name = out[0] + "_node";
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  return n;
}

// An empty opset-13 graph with one float input x of unknown shape.
ir::Graph graph_of_x(const std::string& name) {
  ir::Graph g;
  g.name = name;
  g.opset = 13;
  ir::ValueInfo x;
  x.name = "x";
  x.dtype = DType::kFloat32;
  g.inputs = {x};
  return g;
}

// y = dynamic MatMul of x by w with bias b, y2 = the same x by w2 without bias (one
// DynamicQuantizeLinear for both, as the exporter writes a shared activation).
ir::Graph dynamic_matmuls(int64_t k, int64_t n, std::mt19937& rng) {
  ir::Graph g = graph_of_x("dynamic_matmuls");
  std::uniform_int_distribution<int> code(-127, 127);
  std::uniform_real_distribution<float> u(0.001f, 0.02f);
  for (const char* w : {"w", "w2"}) {
    Tensor t(DType::kInt8, {k, n});
    for (auto& v : t.values<int8_t>()) v = static_cast<int8_t>(code(rng));
    t.data<int8_t>()[0] = 127;  // full range: oneDNN's u8 x s8 sums are exact only with VNNI
    g.initializers[w] = t;
    Tensor s(DType::kFloat32, {n});
    for (auto& v : s.values<float>()) v = u(rng);
    g.initializers[std::string(w) + "_scale"] = s;
  }
  g.initializers["w_zero_point"] = Tensor(DType::kInt8, {n});
  Tensor b(DType::kFloat32, {n});
  for (auto& v : b.values<float>()) v = u(rng) * 50.f - 0.5f;
  g.initializers["b"] = b;
  g.nodes = {node("DynamicQuantizeLinear", {"x"}, {"xq", "xs", "xz"})};
  for (const std::string w : {"w", "w2"}) {
    g.nodes.push_back(node("MatMulInteger", {"xq", w, "xz", "w_zero_point"}, {w + "_acc"}));
    ir::Node cast = node("Cast", {w + "_acc"}, {w + "_accf"});
    cast.attrs["to"] = int64_t{1};
    g.nodes.push_back(cast);
    g.nodes.push_back(node("Mul", {"xs", w + "_scale"}, {w + "_scales"}));
  }
  g.nodes.push_back(node("Mul", {"w_accf", "w_scales"}, {"scaled"}));
  g.nodes.push_back(node("Add", {"scaled", "b"}, {"y"}));
  g.nodes.push_back(node("Mul", {"w2_accf", "w2_scales"}, {"y2"}));
  g.outputs = {{"y", DType::kFloat32, std::nullopt}, {"y2", DType::kFloat32, std::nullopt}};
  return g;
}

// The exporter's ConvInteger chain: x -> DynamicQuantizeLinear -> ConvInteger(w, w_zero_point,
// attrs) -> Cast -> Mul(., Mul(s_x, w_scale)) -> Add(b) = y, with random per-channel scales and
// biases of shape [1, M, 1, 1].
ir::Graph dynamic_conv(Tensor w, Tensor w_zero_point, std::map<std::string, ir::AttributeValue> attrs,
                       std::mt19937& rng) {
  ir::Graph g = graph_of_x("dynamic_conv");
  const int64_t m = w.dim(0);
  g.initializers["w"] = std::move(w);
  g.initializers["w_zero_point"] = std::move(w_zero_point);
  Tensor s(DType::kFloat32, {1, m, 1, 1}), b(DType::kFloat32, {1, m, 1, 1});
  std::uniform_real_distribution<float> u(0.001f, 0.02f);
  for (auto& v : s.values<float>()) v = u(rng);
  for (auto& v : b.values<float>()) v = u(rng) * 50.f - 0.5f;
  g.initializers["w_scale"] = s;
  g.initializers["b"] = b;
  ir::Node conv = node("ConvInteger", {"xq", "w", "xz", "w_zero_point"}, {"acc"});
  conv.attrs = std::move(attrs);
  ir::Node cast = node("Cast", {"acc"}, {"accf"});
  cast.attrs["to"] = int64_t{1};
  g.nodes = {node("DynamicQuantizeLinear", {"x"}, {"xq", "xs", "xz"}), conv, cast,
             node("Mul", {"xs", "w_scale"}, {"scales"}), node("Mul", {"accf", "scales"}, {"scaled"}),
             node("Add", {"scaled", "b"}, {"y"})};
  g.outputs = {{"y", DType::kFloat32, std::nullopt}};
  return g;
}

// got equals want up to 1e-6 of want's (non-zero) range: the same integers, only the float
// rounding of the last multiply-add may differ.
void expect_within_range(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  float range = 0, worst = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    range = std::max(range, std::abs(want.data<float>()[i]));
    worst = std::max(worst, std::abs(got.data<float>()[i] - want.data<float>()[i]));
  }
  EXPECT_LE(worst, 1e-6f * range) << what;
  EXPECT_GT(range, 0.f) << what;
}

TEST(DynamicMatMulFusion, FusedEqualsOpByOpAndTheClosedForm) {
  std::mt19937 rng(3);
  const int64_t k = 96, n = 40;
  const ir::Graph g = dynamic_matmuls(k, n, rng);
  {
    ir::Graph fused = g;
    const ir::RuleCounts counts = runtime::apply_execution_fusions(fused, {"x", "y", "y2"});
    EXPECT_EQ(ir::count_of(counts, "fuse_dynamic_matmul"), 2);
    // One node per MatMul, both reading the shared DynamicQuantizeLinear's codes (x quantized once).
    ASSERT_EQ(fused.nodes.size(), 3u);
    EXPECT_EQ(fused.nodes[0].op_type, "DynamicQuantizeLinear");
    for (size_t i = 1; i < 3; ++i) {
      EXPECT_EQ(fused.nodes[i].op_type, "DynamicQuantMatMul");
      EXPECT_EQ(fused.nodes[i].inputs, (std::vector<std::string>{"xq", i == 1 ? "w" : "w2", "w_zero_point",
                                                                 i == 1 ? "w_scale" : "w2_scale", i == 1 ? "b" : "",
                                                                 "xs", "xz"}));
    }
  }
  runtime::SessionOptions unfused_options;
  unfused_options.fuse_activations = false;
  runtime::Session fused(g), unfused(g, unfused_options);
  for (const Shape& shape : {Shape{1, k}, Shape{3, 7, k}, Shape{64, k}}) {
    Tensor x(DType::kFloat32, shape);
    std::uniform_real_distribution<float> u(-1.5f, 3.f);
    for (auto& v : x.values<float>()) v = u(rng);
    const auto a = fused.run({{"x", x}});
    const auto b = unfused.run({{"x", x}});
    // The closed form: DynamicQuantizeLinear's parameters and codes, exact integer sums.
    float lo = 0, hi = 0;
    for (float v : x.values<float>()) lo = std::min(lo, v), hi = std::max(hi, v);
    const float sx = (hi - lo) / 255.f;
    const int zx = static_cast<int>(std::nearbyint(-lo / sx));
    const int64_t m = x.numel() / k;
    for (const std::string out : {"y", "y2"}) {
      const std::string w = out == "y" ? "w" : "w2";
      const Tensor& ya = a.at(out);
      const Tensor& yb = b.at(out);
      Shape want(shape.begin(), shape.end() - 1);
      want.push_back(n);
      ASSERT_EQ(ya.shape(), want);
      ASSERT_EQ(yb.shape(), want);
      const int8_t* wq = g.initializer(w)->data<int8_t>();
      const float* ws = g.initializer(w + "_scale")->data<float>();
      float range = 0, worst_unfused = 0, worst_closed = 0;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          int64_t acc = 0;
          for (int64_t l = 0; l < k; ++l) {
            const float q = std::nearbyint(x.data<float>()[i * k + l] / sx) + static_cast<float>(zx);
            acc += (static_cast<int64_t>(std::clamp(q, 0.f, 255.f)) - zx) * wq[l * n + j];
          }
          float expect = static_cast<float>(acc) * (sx * ws[j]);
          if (out == "y") expect += g.initializer("b")->data<float>()[j];
          const float va = ya.data<float>()[i * n + j], vb = yb.data<float>()[i * n + j];
          range = std::max(range, std::abs(vb));
          worst_unfused = std::max(worst_unfused, std::abs(va - vb));
          worst_closed = std::max(worst_closed, std::abs(va - expect));
        }
      // Equal integers: only the rounding of the final multiply (and add) may differ.
      EXPECT_LE(worst_unfused, 1e-6f * range) << out << " " << shape_str(shape);
      EXPECT_LE(worst_closed, 1e-5f * range) << out << " " << shape_str(shape);
      EXPECT_GT(range, 0.f);
    }
  }
}

// Without VNNI, 8-bit weights run on oneDNN's f32 matmul over the integers (SLIMQUANT_INT8_COMPUTE=f32
// forces that path on any CPU): float sums integers exactly only while they stay below 2^24, so a
// depth of 1100 with weights up to 127 (1100 * 255 * 127 > 2^24) is cut into three exact slices.
// With sums past 2^24 (w2), an unsliced float sum would round the integer, and y2 (Cast, one Mul)
// would differ in its bits (checked: one slice fails this test).
TEST(DynamicMatMulFusion, FloatPathSumsDeepProductsExactlyInSlices) {
  struct ForceFloat {
    ForceFloat() { setenv("SLIMQUANT_INT8_COMPUTE", "f32", 1); }
    ~ForceFloat() { unsetenv("SLIMQUANT_INT8_COMPUTE"); }
  } force;
  std::mt19937 rng(5);
  const int64_t k = 1100, n = 24;
  ir::Graph g = dynamic_matmuls(k, n, rng);
  // w2 near +127 everywhere and x's codes near 255 (zero point 0): sums near 1100 * 255 * 127, past 2^24.
  std::uniform_int_distribution<int> near_top(120, 127);
  for (auto& v : g.initializers["w2"].values<int8_t>()) v = static_cast<int8_t>(near_top(rng));
  runtime::SessionOptions unfused_options;
  unfused_options.fuse_activations = false;
  runtime::Session fused(g), unfused(g, unfused_options);
  for (const Shape& shape : {Shape{5, k}, Shape{2, 33, k}}) {
    Tensor x(DType::kFloat32, shape);
    std::uniform_real_distribution<float> top(2.9f, 3.f);
    for (auto& v : x.values<float>()) v = top(rng);
    x.data<float>()[0] = 0.f;  // the range [0, 3]: zero point 0
    const auto a = fused.run({{"x", x}});
    const auto b = unfused.run({{"x", x}});
    EXPECT_EQ(a.at("y2").to_float_vector(), b.at("y2").to_float_vector()) << shape_str(shape);
    const std::vector<float> ya = a.at("y").to_float_vector(), yb = b.at("y").to_float_vector();
    float range = 0, worst = 0;
    for (size_t i = 0; i < ya.size(); ++i) range = std::max(range, std::abs(yb[i])), worst = std::max(worst, std::abs(ya[i] - yb[i]));
    EXPECT_LE(worst, 1e-6f * range) << shape_str(shape);
  }
}

// The exporter's ConvInteger form: u8 weights = s8 codes + 128 with one zero point 128, per-channel
// scales and bias as [1, M, 1, 1]; stride 2, pads 1, and a grouped convolution.
TEST(DynamicMatMulFusion, FusedConvolutionEqualsOpByOp) {
  std::mt19937 rng(9);
  for (const int64_t group : {int64_t{1}, int64_t{2}}) {
    const int64_t c = 4, m = 6;
    Tensor w(DType::kUInt8, {m, c / group, 3, 3});
    std::uniform_int_distribution<int> code(1, 255);
    for (auto& v : w.values<uint8_t>()) v = static_cast<uint8_t>(code(rng));
    w.data<uint8_t>()[0] = 1;  // -127: full range
    const ir::Graph g = dynamic_conv(w, Tensor::scalar<uint8_t>(128),
                                     {{"pads", std::vector<int64_t>{1, 1, 1, 1}},
                                      {"strides", std::vector<int64_t>{2, 2}},
                                      {"group", group}},
                                     rng);
    {
      ir::Graph fused = g;
      const int expected = runtime::int8::cpu_has_exact_int8_dot() ? 1 : 0;  // the fused one needs VNNI
      EXPECT_EQ(ir::count_of(runtime::apply_execution_fusions(fused, {"x", "y"}), "fuse_dynamic_matmul"), expected);
    }
    runtime::SessionOptions unfused_options;
    unfused_options.fuse_activations = false;
    runtime::Session fused(g), unfused(g, unfused_options);
    for (const Shape& shape : {Shape{1, c, 9, 9}, Shape{3, c, 16, 12}}) {
      Tensor xt(DType::kFloat32, shape);
      std::uniform_real_distribution<float> ux(-0.7f, 2.f);
      for (auto& v : xt.values<float>()) v = ux(rng);
      const Tensor ya = fused.run({{"x", xt}}).at("y");
      EXPECT_EQ(ya.shape(), (Shape{shape[0], m, (shape[2] + 1) / 2, (shape[3] + 1) / 2}));
      expect_within_range(ya, unfused.run({{"x", xt}}).at("y"),
                          "group " + std::to_string(group) + " " + shape_str(shape));
    }
  }
}

// A chain whose intermediate value is kept (a hook, a requested output) stays op by op.
TEST(DynamicMatMulFusion, KeptIntermediatesAreNotFused) {
  std::mt19937 rng(5);
  ir::Graph g = dynamic_matmuls(16, 8, rng);
  const ir::RuleCounts counts = runtime::apply_execution_fusions(g, {"x", "y", "y2", "w_accf", "w2_scales"});
  EXPECT_EQ(ir::count_of(counts, "fuse_dynamic_matmul"), 0);
}

}  // namespace

// A skip connection after the dynamic MatMul (x + proj(...), a transformer's residual): the Add of
// a value of the output's known shape becomes the fused node's last input, added in its epilogue
// pass; an Add whose other operand broadcasts stays apart. Both equal the op-by-op execution.
TEST(DynamicMatMulFusion, ResidualAddOfTheOutputsShapeFoldsIntoTheEpilogue) {
  std::mt19937 rng(11);
  const int64_t k = 48, n = 32;
  for (const bool broadcast : {false, true}) {
    ir::Graph g = dynamic_matmuls(k, n, rng);
    const Shape r_shape = broadcast ? Shape{n} : Shape{2, 5, n};
    g.inputs = {test::float_value("x", {2, 5, k}), test::float_value("r", r_shape)};
    g.nodes.push_back(node("Add", {"r", "y"}, {"z"}));
    g.outputs = {{"z", DType::kFloat32, std::nullopt}, {"y2", DType::kFloat32, std::nullopt}};
    g.value_info["y"] = test::float_value("y", {2, 5, n});
    {
      ir::Graph fused = g;
      EXPECT_EQ(ir::count_of(runtime::apply_execution_fusions(fused, {"x", "r", "z", "y2"}), "fuse_dynamic_matmul"), 2);
      const auto it = std::find_if(fused.nodes.begin(), fused.nodes.end(),
                                   [](const ir::Node& nd) { return nd.outputs[0] == "z"; });
      ASSERT_NE(it, fused.nodes.end());
      EXPECT_EQ(it->op_type, broadcast ? "Add" : "DynamicQuantMatMul");
      if (!broadcast) {
        EXPECT_EQ(it->inputs.back(), "r");
      }
    }
    runtime::SessionOptions unfused_options;
    unfused_options.fuse_activations = false;
    runtime::Session fused(g), unfused(g, unfused_options);
    Tensor x(DType::kFloat32, {2, 5, k}), r(DType::kFloat32, r_shape);
    std::uniform_real_distribution<float> u(-1.f, 2.f);
    for (auto& v : x.values<float>()) v = u(rng);
    for (auto& v : r.values<float>()) v = u(rng);
    expect_within_range(fused.run({{"x", x}, {"r", r}}).at("z"), unfused.run({{"x", x}, {"r", r}}).at("z"),
                        broadcast ? "broadcast" : "same shape");
  }
}

// Windows that tile the input (stride = kernel, no padding: a ViT's patch embedding) run as one
// MatMul of the windows as rows; rows and columns past the last whole window are dropped, as the
// convolution drops them. Square and non-square windows, one and three channels.
TEST(DynamicMatMulFusion, TilingWindowsRunAsOneMatMulAndEqualOpByOp) {
  std::mt19937 rng(13);
  struct Case {
    int64_t c, m, kh, kw;
    Shape x;
  };
  for (const Case& k : {Case{1, 16, 4, 4, {5, 1, 28, 28}}, Case{3, 8, 4, 2, {2, 3, 10, 9}}}) {
    Tensor w(DType::kInt8, {k.m, k.c, k.kh, k.kw});
    std::uniform_int_distribution<int> code(-127, 127);
    for (auto& v : w.values<int8_t>()) v = static_cast<int8_t>(code(rng));
    w.data<int8_t>()[0] = -127;
    const ir::Graph g = dynamic_conv(w, Tensor(DType::kInt8, {k.m}),
                                     {{"kernel_shape", std::vector<int64_t>{k.kh, k.kw}},
                                      {"strides", std::vector<int64_t>{k.kh, k.kw}}},
                                     rng);
    runtime::SessionOptions unfused_options;
    unfused_options.fuse_activations = false;
    runtime::Session fused(g), unfused(g, unfused_options);
    Tensor xt(DType::kFloat32, k.x);
    std::uniform_real_distribution<float> ux(-0.7f, 2.f);
    for (auto& v : xt.values<float>()) v = ux(rng);
    const Tensor ya = fused.run({{"x", xt}}).at("y");
    ASSERT_EQ(ya.shape(), (Shape{k.x[0], k.m, k.x[2] / k.kh, k.x[3] / k.kw}));
    expect_within_range(ya, unfused.run({{"x", xt}}).at("y"), shape_str(k.x));
  }
}

// A GELU feeding a dynamic MatMul alone (a transformer's second MLP product) hands its output's range
// over from its own pass; the MatMul skips its scan of x. The same run with the GELU's output
// requested (kept, so nothing is handed over) gives the same bits; a NaN in x is skipped by both.
TEST(DynamicMatMulFusion, GeluHandsItsRangeToTheDynamicMatMul) {
  std::mt19937 rng(21);
  const int64_t k = 40, n = 24;
  ir::Graph g = dynamic_matmuls(k, n, rng);
  g.initializers["sqrt2"] = Tensor::scalar(1.4142135f);
  g.initializers["one"] = Tensor::scalar(1.f);
  g.initializers["half"] = Tensor::scalar(0.5f);
  g.initializers["gain"] = Tensor::scalar(1.5f);
  // x * 1.5 -> erf GELU -> h (the pattern's input is an intermediate value, as after a MatMul), read
  // by the DynamicQuantizeLinear alone (replacing x there).
  const std::vector<ir::Node> gelu = {node("Mul", {"x", "gain"}, {"t"}), node("Div", {"t", "sqrt2"}, {"d"}),
                                      node("Erf", {"d"}, {"e"}), node("Add", {"e", "one"}, {"e1"}),
                                      node("Mul", {"t", "e1"}, {"m"}), node("Mul", {"m", "half"}, {"h"})};
  g.nodes[0].inputs[0] = "h";
  g.nodes.insert(g.nodes.begin(), gelu.begin(), gelu.end());
  // One reader of the codes: y2's chain goes, so the MatMul quantizes h itself.
  g.nodes.erase(std::remove_if(g.nodes.begin(), g.nodes.end(),
                               [](const ir::Node& nd) { return nd.outputs[0].rfind("w2", 0) == 0 || nd.outputs[0] == "y2"; }),
                g.nodes.end());
  g.outputs = {{"y", DType::kFloat32, std::nullopt}};
  {
    ir::Graph fused = g;
    const ir::RuleCounts counts = runtime::apply_execution_fusions(fused, {"x", "y"});
    EXPECT_EQ(ir::count_of(counts, "fuse_erf_gelu"), 1);
    EXPECT_EQ(ir::count_of(counts, "hand_over_gelu_range"), runtime::ew::gelu_pass_available() ? 1 : 0);
  }
  runtime::Session session(g);
  for (const Shape& shape : {Shape{3, k}, Shape{2, 9, k}}) {
    Tensor x(DType::kFloat32, shape);
    std::uniform_real_distribution<float> u(-4.f, 3.f);
    for (auto& v : x.values<float>()) v = u(rng);
    x.data<float>()[1] = std::numeric_limits<float>::quiet_NaN();
    runtime::RunOptions handed, kept;
    handed.outputs = {"y"};
    kept.outputs = {"y", "h"};
    const Tensor a = session.run({{"x", x}}, handed).at("y");
    const Tensor b = session.run({{"x", x}}, kept).at("y");
    ASSERT_EQ(a.shape(), b.shape());
    for (int64_t i = 0; i < a.numel(); ++i) {
      const float va = a.data<float>()[i], vb = b.data<float>()[i];
      if (std::isnan(vb)) EXPECT_TRUE(std::isnan(va)) << i;
      else EXPECT_EQ(va, vb) << shape_str(shape) << " " << i;
    }
  }
}
