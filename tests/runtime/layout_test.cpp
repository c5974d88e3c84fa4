// Blocked layouts between oneDNN convolutions and the residual Add fused into a Conv (sum
// post-op): every case is compared with the same graph run plain and unfused
// (SessionOptions{blocked_layouts = false, fuse_activations = false}), the reference path.
#include <dnnl.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "slimquant/ir/onnx_io.h"
#include "slimquant/runtime/kernel.h"
#include "slimquant/runtime/session.h"
#include "test_util.h"

using namespace slimquant;

namespace {

Tensor random_tensor(const Shape& shape, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  Tensor t(DType::kFloat32, shape);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (float& v : t.values<float>()) v = dist(gen);
  return t;
}

void expect_close(const Tensor& got, const Tensor& want, const std::string& what, float tol = 1e-4f) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  if (got.dtype() != DType::kFloat32) {
    ASSERT_EQ(std::memcmp(got.raw(), want.raw(), got.nbytes()), 0) << what;
    return;
  }
  auto g = got.values<float>();
  auto w = want.values<float>();
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_NEAR(g[i], w[i], tol * (1.f + std::fabs(w[i]))) << what << " element " << i;
}

runtime::Session reference_session(const ir::Graph& g) {
  runtime::SessionOptions o;
  o.blocked_layouts = false;
  o.fuse_activations = false;
  return runtime::Session(g, o);
}

// Small graph builder: 2-D convolutions over [N, C, H, W] values.
struct Builder {
  ir::Graph g;
  uint32_t seed = 1;
  explicit Builder(const Shape& input) {
    g.opset = 13;
    ir::ValueInfo in;
    in.name = "x";
    in.dtype = DType::kFloat32;
    std::vector<ir::Dim> dims;
    for (int64_t d : input) dims.push_back({d, ""});
    in.dims = dims;
    g.inputs.push_back(in);
  }
  std::string conv(const std::string& x, int64_t cin, int64_t cout, int64_t k, const std::string& out,
                   int64_t group = 1, int64_t stride = 1) {
    ir::Node n;
    n.op_type = "Conv";
    n.name = out + "_conv";
    const std::string w = out + "_w", b = out + "_b";
    g.initializers[w] = random_tensor({cout, cin / group, k, k}, seed++, -0.5f, 0.5f);
    g.initializers[b] = random_tensor({cout}, seed++);
    n.inputs = {x, w, b};
    n.outputs = {out};
    n.attrs["pads"] = std::vector<int64_t>{k / 2, k / 2, k / 2, k / 2};
    n.attrs["group"] = group;
    n.attrs["strides"] = std::vector<int64_t>{stride, stride};
    g.nodes.push_back(n);
    return out;
  }
  std::string op(const std::string& type, std::vector<std::string> inputs, const std::string& out) {
    ir::Node n;
    n.op_type = type;
    n.name = out + "_" + type;
    n.inputs = std::move(inputs);
    n.outputs = {out};
    g.nodes.push_back(n);
    return out;
  }
  std::string scalar(const std::string& name, Tensor t) {
    g.initializers[name] = std::move(t);
    return name;
  }
  void output(const std::string& name) {
    ir::ValueInfo o;
    o.name = name;
    o.dtype = DType::kFloat32;
    g.outputs.push_back(o);
  }
};

// Values seen by a hook, cloned.
std::map<std::string, Tensor> run_hooked(runtime::Session& s, const std::map<std::string, Tensor>& feeds) {
  std::map<std::string, Tensor> seen;
  runtime::RunOptions o;
  o.on_value = [&](const std::string& name, const Tensor& t) { seen[name] = t.clone(); };
  s.run(feeds, o);
  return seen;
}
std::map<std::string, Tensor> run_hooked(runtime::Session& s, const Tensor& x, const std::string& input = "x") {
  return run_hooked(s, {{input, x}});
}

// The layouts each kernel declares when it is registered, which the session plans from alone.
TEST(SessionLayouts, KernelsDeclareTheLayoutsTheyReadAndWrite) {
  using Role = runtime::KernelLayouts::Role;
  const runtime::KernelRegistry& r = runtime::KernelRegistry::instance();
  for (const auto& [op, domain] : {std::pair<const char*, const char*>{"Conv", ""}, {"QConv", "com.slimquant"}}) {
    SCOPED_TRACE(op);
    EXPECT_EQ(r.layouts(op, domain).role, Role::kAware);
    EXPECT_EQ(r.layouts(op, domain).blocked_inputs, 0b1001u) << "x and the fused residual addend";
  }
  EXPECT_EQ(r.layouts("MaxPool").blocked_inputs, 0b1u);
  EXPECT_EQ(r.layouts("Add", "ai.onnx").role, Role::kChannelBlocked);
  EXPECT_TRUE(r.layouts("Mul").tries_passthrough);
  EXPECT_FALSE(r.layouts("Concat").tries_passthrough);
  EXPECT_TRUE(r.layouts("GlobalAveragePool").reads_blocked_for_plain_output);
  EXPECT_EQ(r.layouts("Relu").role, Role::kPassthrough);
  EXPECT_EQ(r.layouts("Gelu").role, Role::kPlain) << "ONNX's Gelu kernel; the fused erf GELU passes layouts through";
  EXPECT_EQ(r.layouts("Softmax").role, Role::kPlain);
  EXPECT_EQ(r.layouts("NoSuchOp").role, Role::kPlain);
}

TEST(SessionLayouts, FixtureModelsMatchThePlainUnfusedPath) {
  for (const char* name : {"resnet_small", "mobilenetv2_small", "vit_small"}) {
    const ir::Graph g = ir::load_onnx(test::fixture_model(name));
    runtime::Session fast(g), ref = reference_session(g);
    for (int64_t batch : {1, 8}) {
      const Tensor x = random_tensor({batch, 1, 28, 28}, 7, 0.f, 1.f);
      expect_close(fast.run_single(x), ref.run_single(x), std::string(name) + " batch " + std::to_string(batch));
    }
  }
}

TEST(SessionLayouts, HooksSeePlainValuesEqualToThePlainPath) {
  // Fusion off: hooks must see every value; blocked ones are handed over as plain copies.
  const ir::Graph g = ir::load_onnx(test::fixture_model("resnet_small"));
  runtime::SessionOptions o;
  o.fuse_activations = false;
  runtime::Session blocked(g, o), ref = reference_session(g);
  const Tensor x = random_tensor({2, 1, 28, 28}, 3, 0.f, 1.f);
  auto got = run_hooked(blocked, x, "input"), want = run_hooked(ref, x, "input");
  EXPECT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    expect_close(got.at(name), t, name);
  }
}

TEST(SessionLayouts, ResidualAddAndReluFuseIntoTheConv) {
  // x -> A (3x3) -> a ; x -> B (1x1) -> b ; Relu(a + b) -> r -> C -> y.
  Builder b({2, 16, 9, 9});
  b.conv("x", 16, 16, 3, "a");
  b.conv("x", 16, 16, 1, "b");
  b.op("Add", {"a", "b"}, "s");
  b.op("Relu", {"s"}, "r");
  b.conv("r", 16, 8, 3, "y");
  b.output("y");
  runtime::Session fast(b.g), ref = reference_session(b.g);
  const Tensor x = random_tensor({2, 16, 9, 9}, 11);
  auto got = run_hooked(fast, x), want = run_hooked(ref, x);
  // The Add and the Relu ran inside a's Conv: neither a nor s exists any more, r does.
  EXPECT_FALSE(got.count("a"));
  EXPECT_FALSE(got.count("s"));
  ASSERT_TRUE(got.count("r"));
  expect_close(got.at("r"), want.at("r"), "r");
  expect_close(got.at("y"), want.at("y"), "y");
  // Asking for the Conv output keeps it observable, so nothing is fused away.
  runtime::RunOptions ask;
  ask.outputs = {"a", "y"};
  auto out = fast.run({{"x", x}}, ask);
  expect_close(out.at("a"), want.at("a"), "a requested");
  expect_close(out.at("y"), want.at("y"), "y with a requested");
}

// A 3x3 convolution with pads 1, stride 1, in double precision ([C, H, W], one sample).
std::vector<double> conv3x3_double(const std::vector<double>& x, int64_t cin, int64_t h, int64_t w, const Tensor& weights,
                                   const Tensor& bias) {
  const int64_t cout = weights.dim(0);
  auto wv = weights.values<float>();
  auto bv = bias.values<float>();
  std::vector<double> y(static_cast<size_t>(cout * h * w));
  for (int64_t o = 0; o < cout; ++o)
    for (int64_t i = 0; i < h; ++i)
      for (int64_t j = 0; j < w; ++j) {
        double sum = bv[o];
        for (int64_t c = 0; c < cin; ++c)
          for (int64_t ki = 0; ki < 3; ++ki)
            for (int64_t kj = 0; kj < 3; ++kj) {
              const int64_t yi = i + ki - 1, xj = j + kj - 1;
              if (yi < 0 || yi >= h || xj < 0 || xj >= w) continue;
              sum += wv[((o * cin + c) * 3 + ki) * 3 + kj] * x[(c * h + yi) * w + xj];
            }
        y[(o * h + i) * w + j] = sum;
      }
  return y;
}

// Wide 3x3 stride-1 convolutions take oneDNN's Winograd algorithm where it has one (AVX-512):
// as close to the exact result as the direct kernel, but not bit-equal to it, which is how the
// test sees the choice. A narrow one (16 outputs, where Winograd loses) and every convolution with
// the option off or below AVX-512 stay direct, bit for bit.
TEST(SessionLayouts, WideThreeByThreeConvolutionsTakeWinogradWithinFloatRounding) {
  constexpr int64_t kC = 64, kSide = 16;
  Builder b({1, kC, kSide, kSide});
  b.conv("x", kC, kC, 3, "a");
  b.op("Add", {"a", "x"}, "s");
  b.op("Relu", {"s"}, "r");
  b.conv("r", kC, kC, 3, "y");
  b.conv("x", kC, 16, 3, "narrow");
  b.output("y");
  b.output("narrow");
  runtime::SessionOptions direct_only;
  direct_only.winograd = false;
  runtime::Session winograd(b.g), direct(b.g, direct_only);
  const Tensor x = random_tensor({1, kC, kSide, kSide}, 5);
  auto got = winograd.run({{"x", x}}), plain = direct.run({{"x", x}});

  auto xv = x.values<float>();
  const std::vector<double> xd(xv.begin(), xv.end());
  std::vector<double> r = conv3x3_double(xd, kC, kSide, kSide, b.g.initializers.at("a_w"), b.g.initializers.at("a_b"));
  for (size_t i = 0; i < r.size(); ++i) r[i] = std::max(0.0, r[i] + xd[i]);
  const std::map<std::string, std::vector<double>> exact = {
      {"y", conv3x3_double(r, kC, kSide, kSide, b.g.initializers.at("y_w"), b.g.initializers.at("y_b"))},
      {"narrow", conv3x3_double(xd, kC, kSide, kSide, b.g.initializers.at("narrow_w"), b.g.initializers.at("narrow_b"))}};
  // Error relative to the output's largest magnitude (sums of 576 products: an element near zero
  // carries the rounding of its large terms).
  const auto relative_error = [](const Tensor& t, const std::vector<double>& reference) {
    auto a = t.values<float>();
    double diff = 0, scale = 0;
    for (size_t i = 0; i < reference.size(); ++i) {
      diff = std::max(diff, std::fabs(a[i] - reference[i]));
      scale = std::max(scale, std::fabs(reference[i]));
    }
    return diff / scale;
  };
  for (const auto& [name, reference] : exact) {
    EXPECT_LT(relative_error(got.at(name), reference), 2e-6) << "winograd " << name;
    EXPECT_LT(relative_error(plain.at(name), reference), 2e-6) << "direct " << name;
  }
  const auto bit_equal = [](const Tensor& p, const Tensor& q) {
    return p.nbytes() == q.nbytes() && std::memcmp(p.raw(), q.raw(), p.nbytes()) == 0;
  };
  EXPECT_TRUE(bit_equal(got.at("narrow"), plain.at("narrow")));
  const bool winograd_offered = dnnl::get_effective_cpu_isa() >= dnnl::cpu_isa::avx512_core;
  EXPECT_EQ(bit_equal(got.at("y"), plain.at("y")), !winograd_offered)
      << (winograd_offered ? "AVX-512: the wide convolutions should run on Winograd"
                           : "below AVX-512 oneDNN has no Winograd: direct");
}

TEST(SessionLayouts, ResidualAddendFromAPlainGraphInputAndAClip) {
  // The addend is the (plain) graph input itself; the Add is followed by Clip(0, 6).
  Builder b({1, 8, 6, 6});
  b.conv("x", 8, 8, 3, "a");
  b.op("Add", {"x", "a"}, "s");
  b.op("Clip", {"s", b.scalar("lo", Tensor::scalar(0.f)), b.scalar("hi", Tensor::scalar(0.5f))}, "r");
  b.conv("r", 8, 8, 1, "y");
  b.output("y");
  runtime::Session fast(b.g), ref = reference_session(b.g);
  for (uint32_t seed : {1u, 2u}) {
    const Tensor x = random_tensor({1, 8, 6, 6}, seed);
    expect_close(fast.run_single(x), ref.run_single(x), "seed " + std::to_string(seed));
  }
}

TEST(SessionLayouts, ElementwiseOpsPassBlockedValuesThroughOrFallBackToPlain) {
  // Fusion off so the Add/Relu/Q/DQ run as their own kernels on blocked data:
  //   a, c: blocked conv outputs (16 channels); Add(a, c) and Relu stay blocked; per-tensor
  //   QuantizeLinear -> u8 in the same blocked order -> DequantizeLinear; Mul with a broadcast
  //   per-channel [16,1,1] constant reads the blocked value (channel_blocked_test.cpp covers that
  //   path); Add with the plain graph input x falls back to plain.
  Builder b({2, 16, 7, 7});
  b.conv("x", 16, 16, 3, "a");
  b.conv("x", 16, 16, 1, "c");
  b.op("Add", {"a", "c"}, "s");
  b.op("Relu", {"s"}, "r");
  b.op("QuantizeLinear", {"r", b.scalar("qs", Tensor::scalar(0.05f)), b.scalar("qz", Tensor::scalar<uint8_t>(3))},
       "rq");
  b.op("DequantizeLinear", {"rq", "qs", "qz"}, "rd");
  b.conv("rd", 16, 16, 3, "d");
  b.op("Mul", {"d", b.scalar("per_channel", random_tensor({16, 1, 1}, 5))}, "m");
  b.conv("m", 16, 16, 3, "e");
  b.op("Add", {"e", "x"}, "f");
  b.conv("f", 16, 4, 3, "y");
  b.output("y");
  runtime::SessionOptions o;
  o.fuse_activations = false;
  runtime::Session fast(b.g, o), ref = reference_session(b.g);
  const Tensor x = random_tensor({2, 16, 7, 7}, 9);
  auto got = run_hooked(fast, x), want = run_hooked(ref, x);
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    expect_close(got.at(name), t, name);
  }
}

// ResNet's stem: Conv -> Relu -> MaxPool feeding both a Conv and the residual Add, and an
// AveragePool whose ceil-mode overhang needs the plain-data correction. The pools read the convs'
// blocked outputs as they are (no reorders) and hand blocked values on.
TEST(SessionLayouts, PoolsReadAndWriteBlockedValues) {
  Builder b({2, 16, 13, 13});
  const std::string stem = b.op("Relu", {b.conv("x", 16, 32, 3, "c0")}, "r0");
  const std::string pooled = b.op("MaxPool", {stem}, "p0");
  b.g.nodes.back().attrs["kernel_shape"] = std::vector<int64_t>{3, 3};
  b.g.nodes.back().attrs["strides"] = std::vector<int64_t>{2, 2};
  b.g.nodes.back().attrs["pads"] = std::vector<int64_t>{1, 1, 1, 1};
  const std::string branch = b.conv(b.op("Relu", {b.conv(pooled, 32, 32, 3, "c1")}, "r1"), 32, 32, 3, "c2");
  const std::string res = b.op("Relu", {b.op("Add", {branch, pooled}, "sum")}, "r2");
  const std::string avg = b.op("AveragePool", {res}, "avg");
  b.g.nodes.back().attrs["kernel_shape"] = std::vector<int64_t>{2, 2};
  b.g.nodes.back().attrs["strides"] = std::vector<int64_t>{2, 2};
  b.g.nodes.back().attrs["ceil_mode"] = int64_t{1};
  b.g.nodes.back().attrs["count_include_pad"] = int64_t{1};
  b.output(b.conv(avg, 32, 8, 1, "head"));
  b.output(avg);
  // A MaxPool asked for its Indices output too works on plain data, whatever its input's layout.
  b.op("MaxPool", {stem}, "p_idx");
  b.g.nodes.back().outputs.push_back("indices");
  b.g.nodes.back().attrs["kernel_shape"] = std::vector<int64_t>{2, 2};
  b.output("p_idx");
  b.g.outputs.push_back({"indices", DType::kInt64, std::nullopt});
  runtime::Session fast(b.g), ref = reference_session(b.g);
  const Tensor x = random_tensor({2, 16, 13, 13}, 11);
  const auto got = fast.run({{"x", x}}), want = ref.run({{"x", x}});
  for (const auto& [name, t] : want) expect_close(got.at(name), t, name);
}

TEST(SessionLayouts, PaddedChannelCountsStayPlain) {
  // 12 channels do not fill nChw8c blocks: the blocked buffer would be larger than the tensor.
  Builder b({3, 5, 8, 8});
  b.conv("x", 5, 12, 3, "a");
  b.conv("a", 12, 12, 3, "c", 12);  // depthwise
  b.op("Add", {"c", "a"}, "s");
  b.conv("s", 12, 6, 1, "y", 1, 2);
  b.output("y");
  runtime::Session fast(b.g), ref = reference_session(b.g);
  const Tensor x = random_tensor({3, 5, 8, 8}, 13);
  expect_close(fast.run_single(x), ref.run_single(x), "y");
}

TEST(SessionFusion, ScalarMulAfterAttentionMatMulBecomesAPostOp) {
  // scores = (q k^T) * 0.125 and 0.125 * (q k^T), as exporters write attention.
  Builder b({2, 4, 5, 8});
  b.g.inputs.push_back({"k", DType::kFloat32, std::vector<ir::Dim>{{2, ""}, {4, ""}, {8, ""}, {5, ""}}});
  b.op("MatMul", {"x", "k"}, "qk");
  b.op("Mul", {"qk", b.scalar("scale", Tensor::scalar(0.125f))}, "scores");
  b.op("MatMul", {"x", "k"}, "qk2");
  b.op("Mul", {"scale", "qk2"}, "scores2");
  b.output("scores");
  b.output("scores2");
  runtime::Session fast(b.g), ref = reference_session(b.g);
  const Tensor x = random_tensor({2, 4, 5, 8}, 31), k = random_tensor({2, 4, 8, 5}, 32);
  const auto got = run_hooked(fast, {{"x", x}, {"k", k}}), want = run_hooked(ref, {{"x", x}, {"k", k}});
  EXPECT_FALSE(got.count("qk"));
  EXPECT_FALSE(got.count("qk2"));
  expect_close(got.at("scores"), want.at("scores"), "scores");
  expect_close(got.at("scores2"), want.at("scores2"), "scores2");
}

// y = Gelu(x W + b) as PyTorch exports it before opset 20 (Div, Erf, Add, Mul, Mul), W [K, n];
// the bias Add reads the product first, or the bias first.
void add_matmul_bias_erf_gelu(Builder& b, int64_t k, int64_t n, uint32_t seed, bool bias_first) {
  b.g.initializers["W"] = random_tensor({k, n}, seed);
  b.g.initializers["bias"] = random_tensor({n}, seed + 1);
  b.op("MatMul", {"x", "W"}, "mm");
  b.op("Add", bias_first ? std::vector<std::string>{"bias", "mm"} : std::vector<std::string>{"mm", "bias"}, "h");
  b.op("Div", {"h", b.scalar("sqrt2", Tensor::scalar(1.4142135f))}, "d");
  b.op("Erf", {"d"}, "e");
  b.op("Add", {"e", b.scalar("one", Tensor::scalar(1.f))}, "e1");
  b.op("Mul", {"h", "e1"}, "m");
  b.op("Mul", {"m", b.scalar("half", Tensor::scalar(0.5f))}, "y");
  b.output("y");
}

TEST(SessionFusion, MatMulBiasAndErfGeluBecomeOneMatMul) {
  Builder b({2, 5, 16});
  add_matmul_bias_erf_gelu(b, 16, 32, 21, /*bias_first=*/false);
  runtime::Session fast(b.g), ref = reference_session(b.g);
  const Tensor x = random_tensor({2, 5, 16}, 23, -2.f, 2.f);
  auto got = run_hooked(fast, x), want = run_hooked(ref, x);
  for (const char* gone : {"mm", "h", "d", "e", "e1", "m"}) EXPECT_FALSE(got.count(gone)) << gone;
  // oneDNN's gelu_erf is a polynomial fit of erf: equal to the exported form to ~1e-6.
  expect_close(got.at("y"), want.at("y"), "y", 2e-6f);
  // A kept intermediate stops the fusion at that point and stays observable.
  runtime::RunOptions ask;
  ask.outputs = {"h", "y"};
  auto out = fast.run({{"x", x}}, ask);
  expect_close(out.at("h"), want.at("h"), "h requested");
  expect_close(out.at("y"), want.at("y"), "y with h requested");
}

TEST(SessionFusion, MatMulBiasFusesWhateverTheRankOfAAndWhenItsShapeIsNotDeclared) {
  // torchvision's ViT export declares no shapes inside the graph: the bias and GELU fused all the
  // same (they were two extra passes per MLP). A 1-D A is one row.
  for (const Shape& a_shape : {Shape{3, 7, 16}, Shape{16}}) {
    Builder b(a_shape);
    b.g.inputs[0].dims.reset();  // rank and shape unknown
    add_matmul_bias_erf_gelu(b, 16, 24, 41, /*bias_first=*/true);
    runtime::Session fast(b.g), ref = reference_session(b.g);
    const Tensor x = random_tensor(a_shape, 43, -2.f, 2.f);
    auto got = run_hooked(fast, x), want = run_hooked(ref, x);
    for (const char* gone : {"mm", "h", "m"}) EXPECT_FALSE(got.count(gone)) << gone << " for A " << shape_str(a_shape);
    ASSERT_EQ(got.at("y").shape(), want.at("y").shape());
    expect_close(got.at("y"), want.at("y"), "y", 2e-6f);
  }
}

TEST(SessionFusion, ErfGeluAfterOtherOpsBecomesOneGeluPass) {
  // The producer is an Add (as after an INT8 QMatMul): the chain becomes one execution-only Gelu.
  Builder b({3, 7, 8});
  b.op("Add", {"x", b.scalar("shift", Tensor::scalar(0.25f))}, "h");
  b.op("Div", {"h", b.scalar("sqrt2", Tensor::scalar(1.4142135f))}, "d");
  b.op("Erf", {"d"}, "e");
  b.op("Add", {b.scalar("one", Tensor::scalar(1.f)), "e"}, "e1");
  b.op("Mul", {"e1", "h"}, "m");
  b.op("Mul", {"m", b.scalar("half", Tensor::scalar(0.5f))}, "y");
  b.output("y");
  runtime::Session fast(b.g), ref = reference_session(b.g);
  const Tensor x = random_tensor({3, 7, 8}, 31, -4.f, 4.f);
  auto got = run_hooked(fast, x), want = run_hooked(ref, x);
  EXPECT_TRUE(got.count("h"));
  for (const char* gone : {"d", "e", "e1", "m"}) EXPECT_FALSE(got.count(gone)) << gone;
  expect_close(got.at("y"), want.at("y"), "y", 2e-6f);
}

}  // namespace

// Squeeze-excitation scaling x * s[N, C, 1, 1] -> QuantizeLinear, and Sub -> Q (s8, zero point):
// the elementwise op quantizes its own result (rows of 1600 elements one by one, rows of 16
// through one float buffer), bit-identical to running the two ops.
TEST(SessionFusion, QuantizeLinearFoldsIntoTheElementwiseOpItAloneReads) {
  for (const int64_t side : {40, 4}) {
    SCOPED_TRACE(side);
    Builder b({2, 6, side, side});
    b.g.inputs.push_back({"s", DType::kFloat32, std::vector<ir::Dim>{{2, ""}, {6, ""}, {1, ""}, {1, ""}}});
    b.op("Mul", {"x", "s"}, "scaled");
    const std::string qs = b.scalar("qs", Tensor::scalar(0.02f)), qz = b.scalar("qz", Tensor::scalar<uint8_t>(3));
    b.op("QuantizeLinear", {"scaled", qs, qz}, "scaled_q");
    b.op("Sub", {"x", b.scalar("third", Tensor::scalar(0.3f))}, "shifted");
    const std::string ss = b.scalar("ss", Tensor::scalar(0.015f)), sz = b.scalar("sz", Tensor::scalar<int8_t>(-5));
    b.op("QuantizeLinear", {"shifted", ss, sz}, "shifted_q");
    b.op("Mul", {"x", "x"}, "kept");  // also requested: its Q must stay a separate pass
    b.op("QuantizeLinear", {"kept", qs, qz}, "kept_q");
    for (const char* o : {"scaled_q", "shifted_q", "kept_q", "kept"}) b.output(o);
    b.g.outputs[0].dtype = b.g.outputs[2].dtype = DType::kUInt8;
    b.g.outputs[1].dtype = DType::kInt8;
    runtime::Session fast(b.g), ref = reference_session(b.g);
    // Values past both ends of the ranges, exact ties of the scale, and a NaN.
    Tensor x = random_tensor({2, 6, side, side}, 41, -6.f, 6.f);
    x.data<float>()[0] = 0.5f * 0.02f;
    x.data<float>()[1] = std::nanf("");
    const Tensor s = random_tensor({2, 6, 1, 1}, 42, -2.f, 2.f);
    const auto got = run_hooked(fast, {{"x", x}, {"s", s}}), want = run_hooked(ref, {{"x", x}, {"s", s}});
    EXPECT_FALSE(got.count("scaled"));
    EXPECT_FALSE(got.count("shifted"));
    EXPECT_TRUE(got.count("kept"));
    for (const char* v : {"scaled_q", "shifted_q", "kept_q"}) expect_close(got.at(v), want.at(v), v);
    // The clamped ends are reached, so saturation is compared too.
    const Tensor& q = want.at("scaled_q");
    const auto [lo, hi] = std::minmax_element(q.data<uint8_t>(), q.data<uint8_t>() + q.numel());
    EXPECT_EQ(*lo, 0);
    EXPECT_EQ(*hi, 255);
  }
  // An int32 sum before a QuantizeLinear (which takes int32 too) folds as well: computed as int32,
  // then quantized as the Q would.
  Builder b({5});
  b.g.inputs[0].dtype = DType::kInt32;
  b.op("Add", {"x", b.scalar("ten", Tensor::scalar<int32_t>(10))}, "sum");
  b.op("QuantizeLinear", {"sum", b.scalar("qs", Tensor::scalar(2.f)), b.scalar("qz", Tensor::scalar<int8_t>(1))}, "sum_q");
  b.output("sum_q");
  b.g.outputs[0].dtype = DType::kInt8;
  runtime::Session fast(b.g);
  const Tensor x = Tensor::from_vector<int32_t>({5}, {-300, -13, 1, 5, 400});
  const Tensor y = fast.run({{"x", x}}).at("sum_q");
  ASSERT_EQ(y.dtype(), DType::kInt8);
  // (x + 10) / 2 rounded half to even, + 1, saturated: -145 -> -128, -1.5 -> -2, 5.5 -> 6, 7.5 -> 8, 205 -> 127.
  EXPECT_EQ(y.to_int64_vector(), (std::vector<int64_t>{-128, -1, 7, 9, 127}));
}

// Softmax -> QuantizeLinear (attention probabilities read by an integer MatMul): the Softmax writes
// the codes itself, bit-identical to running the two ops. Rows of 50 and 197 (several rows per
// quantized span) and of 5000 (one row per span), a u8 and an s8 grid.
TEST(SessionFusion, QuantizeLinearFoldsIntoTheSoftmaxItAloneReads) {
  for (const Shape& shape : {Shape{3, 4, 50}, Shape{2, 197}, Shape{2, 5000}}) {
    SCOPED_TRACE(shape_str(shape));
    Builder b(shape);
    b.op("Softmax", {"x"}, "p");
    b.op("QuantizeLinear", {"p", b.scalar("qs", Tensor::scalar(1.f / 255)), b.scalar("qz", Tensor::scalar<uint8_t>(0))},
         "p_q");
    b.op("Softmax", {"x"}, "p2");
    b.op("QuantizeLinear",
         {"p2", b.scalar("ss", Tensor::scalar(0.003f)), b.scalar("sz", Tensor::scalar<int8_t>(-100))}, "p2_q");
    b.output("p_q");
    b.output("p2_q");
    b.g.outputs[0].dtype = DType::kUInt8;
    b.g.outputs[1].dtype = DType::kInt8;
    runtime::Session fast(b.g), ref = reference_session(b.g);
    const Tensor x = random_tensor(shape, 43, -6.f, 6.f);
    const auto got = run_hooked(fast, x), want = run_hooked(ref, x);
    EXPECT_FALSE(got.count("p"));  // folded: no float probabilities
    EXPECT_FALSE(got.count("p2"));
    EXPECT_TRUE(want.count("p"));  // the reference runs the two ops
    for (const char* v : {"p_q", "p2_q"}) expect_close(got.at(v), want.at(v), v);
  }
}

// A fake-quantized convolution input, QuantizeLinear -> DequantizeLinear -> Conv (a layer's model in
// the sensitivity sweep): the Conv reads the codes and its layout reorder dequantizes them, so no
// float copy of the input is made. The same floats as the DequantizeLinear's: bit-identical to the
// plan that keeps the DequantizeLinear's output (requested, so not folded). Covered: uint8 and int8
// codes, a spatial kernel (blocked path), a large 1x1 (the plain GEMM path, which reorders the codes
// into a plain float copy), and codes quantized from a convolution's blocked output.
TEST(SessionFusion, DequantizeLinearFoldsIntoTheConvItFeeds) {
  Builder b({2, 16, 20, 20});
  const std::string us = b.scalar("us", Tensor::scalar(0.013f)), uz = b.scalar("uz", Tensor::scalar<uint8_t>(131));
  b.op("QuantizeLinear", {"x", us, uz}, "xq");
  b.op("DequantizeLinear", {"xq", us, uz}, "xdq");
  b.conv("xdq", 16, 16, 3, "spatial");
  const std::string ss = b.scalar("ss", Tensor::scalar(0.021f)), sz = b.scalar("sz", Tensor::scalar<int8_t>(-7));
  b.op("QuantizeLinear", {"spatial", ss, sz}, "sq");
  b.op("DequantizeLinear", {"sq", ss, sz}, "sdq");
  b.conv("sdq", 16, 32, 1, "pointwise");
  b.output("pointwise");
  const Tensor x = random_tensor({2, 16, 20, 20}, 77, -2.f, 2.f);
  runtime::Session fast(b.g), ref = reference_session(b.g);
  const auto got = run_hooked(fast, x), want = run_hooked(ref, x);
  EXPECT_FALSE(got.count("xdq"));  // folded: the convolutions read the codes
  EXPECT_FALSE(got.count("sdq"));
  expect_close(got.at("pointwise"), want.at("pointwise"), "pointwise");
  // Bit-identical to the plans that materialise the dequantized values (requested outputs are
  // plain, so each pair below runs the same convolution paths: spatial on blocked, pointwise plain).
  auto run = [&](std::vector<std::string> outputs) {
    runtime::RunOptions o;
    o.outputs = std::move(outputs);
    return fast.run({{"x", x}}, o);
  };
  auto same_bits = [](const Tensor& a, const Tensor& b) {
    return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
  };
  EXPECT_TRUE(same_bits(run({"spatial"}).at("spatial"), run({"spatial", "xdq"}).at("spatial")));
  EXPECT_TRUE(
      same_bits(run({"pointwise", "spatial"}).at("pointwise"), run({"pointwise", "spatial", "sdq"}).at("pointwise")));
}

// A per-channel QuantizeLinear (1-D scale along an axis, as channel-wise convolution inputs have)
// folds into the Add / Sub / Mul / Div it alone reads: the op quantizes each channel's slab with
// that channel's scale and zero point, bit-identical to running the two ops. Covered: a squeeze-
// excitation scaling x * s[C, 1, 1] (u8), the sum of two Conv -> Relu whose outputs oneDNN would
// leave blocked (s8; the fused op must read them in plain order to know each element's channel),
// a negative axis, an axis whose slabs are too short (the op, then the Q as it was), and Concat
// along the quantization axis and along another.
TEST(SessionFusion, PerChannelQuantizeLinearFoldsIntoTheElementwiseOpItAloneReads) {
  constexpr int64_t kC = 6;
  auto channel_scales = [](float base) {
    std::vector<float> s(kC);
    for (int64_t c = 0; c < kC; ++c) s[c] = base * static_cast<float>(c + 1);
    return Tensor::from_vector<float>({kC}, s);
  };
  Builder b({2, kC, 40, 40});
  b.g.inputs.push_back({"s", DType::kFloat32, std::vector<ir::Dim>{{kC, ""}, {1, ""}, {1, ""}}});
  b.op("Mul", {"x", "s"}, "scaled");
  b.op("QuantizeLinear", {"scaled", b.scalar("qs", channel_scales(0.004f)),
                          b.scalar("qz", Tensor::from_vector<uint8_t>({kC}, {0, 3, 128, 255, 7, 40}))}, "scaled_q");
  b.conv("x", kC, kC, 3, "c1");
  b.conv("x", kC, kC, 1, "c2");
  b.op("Relu", {"c1"}, "r1");  // activations keep the Add out of the convolutions (sum post-op)
  b.op("Relu", {"c2"}, "r2");
  b.op("Add", {"r1", "r2"}, "sum");
  b.g.nodes.push_back(b.g.nodes.back());  // QuantizeLinear with axis -3 (= 1 for this rank-4 value)
  ir::Node& q = b.g.nodes.back();
  q.op_type = "QuantizeLinear";
  q.name = "sum_q_QuantizeLinear";
  q.inputs = {"sum", b.scalar("ss", channel_scales(0.01f)),
              b.scalar("sz", Tensor::from_vector<int8_t>({kC}, {-128, -5, 0, 5, 127, 1}))};
  q.outputs = {"sum_q"};
  q.attrs["axis"] = int64_t{-3};
  b.op("Sub", {"x", b.scalar("third", Tensor::scalar(0.3f))}, "shifted");  // slabs of 1 element
  b.g.nodes.push_back(b.g.nodes.back());
  ir::Node& last = b.g.nodes.back();
  last.op_type = "QuantizeLinear";
  last.name = "shifted_q_QuantizeLinear";
  last.inputs = {"shifted", b.scalar("ls", Tensor::from_vector<float>({40}, std::vector<float>(40, 0.02f)))};
  last.outputs = {"shifted_q"};
  last.attrs["axis"] = int64_t{3};
  b.op("Mul", {"x", "x"}, "kept");  // also requested: its Q must stay a separate pass
  b.op("QuantizeLinear", {"kept", "qs", "qz"}, "kept_q");
  // Concat quantizes every input into its place (along the axis), or joins first (another axis).
  b.op("Neg", {"x"}, "negated");
  b.op("Concat", {"x", "negated"}, "joined");
  b.g.nodes.back().attrs["axis"] = int64_t{1};
  std::vector<uint8_t> joined_zero_points(2 * kC);
  for (int64_t c = 0; c < 2 * kC; ++c) joined_zero_points[c] = static_cast<uint8_t>(20 * c);
  b.op("QuantizeLinear", {"joined", b.scalar("js", Tensor::from_vector<float>({2 * kC}, std::vector<float>(2 * kC, 0.03f))),
                          b.scalar("jz", Tensor::from_vector<uint8_t>({2 * kC}, joined_zero_points))}, "joined_q");
  b.op("Concat", {"x", "negated"}, "stacked");
  b.g.nodes.back().attrs["axis"] = int64_t{2};
  b.op("QuantizeLinear", {"stacked", "ss", "sz"}, "stacked_q");
  for (const char* o : {"scaled_q", "sum_q", "shifted_q", "kept_q", "joined_q", "stacked_q", "kept"}) b.output(o);
  b.g.outputs[0].dtype = b.g.outputs[2].dtype = b.g.outputs[3].dtype = b.g.outputs[4].dtype = DType::kUInt8;
  b.g.outputs[1].dtype = b.g.outputs[5].dtype = DType::kInt8;
  runtime::Session fast(b.g), ref = reference_session(b.g);
  Tensor x = random_tensor({2, kC, 40, 40}, 51, -6.f, 6.f);
  x.data<float>()[0] = 0.5f * 0.02f;  // an exact tie
  x.data<float>()[1] = std::nanf("");
  const Tensor s = random_tensor({kC, 1, 1}, 52, -2.f, 2.f);
  const auto got = run_hooked(fast, {{"x", x}, {"s", s}}), want = run_hooked(ref, {{"x", x}, {"s", s}});
  for (const char* gone : {"scaled", "sum", "shifted", "joined", "stacked"}) EXPECT_FALSE(got.count(gone)) << gone;
  EXPECT_TRUE(got.count("kept"));
  for (const char* v : {"scaled_q", "sum_q", "shifted_q", "kept_q", "joined_q", "stacked_q"})
    expect_close(got.at(v), want.at(v), v);
  // Both ends of every channel's range are reached, so saturation is compared too.
  const Tensor& scaled = want.at("scaled_q");
  const auto [lo, hi] = std::minmax_element(scaled.data<uint8_t>(), scaled.data<uint8_t>() + scaled.numel());
  EXPECT_EQ(*lo, 0);
  EXPECT_EQ(*hi, 255);
  const Tensor& sum = want.at("sum_q");
  const auto [slo, shi] = std::minmax_element(sum.data<int8_t>(), sum.data<int8_t>() + sum.numel());
  EXPECT_EQ(*slo, -128);
  EXPECT_EQ(*shi, 127);
}

// FPN top-down sums: Add(a, Resize(r)) with a nearest, asymmetric, floor Resize by integer factors
// reads r directly, with a folded per-channel Q (u8), a per-tensor Q (s8) or a float32 result, the
// small operand on either side, and equal or unequal factors; a half_pixel Resize stays separate.
TEST(SessionFusion, NearestUpsampleFoldsIntoTheElementwiseOpItAloneFeeds) {
  constexpr int64_t kC = 3;
  Builder b({2, kC, 24, 20});
  b.g.opset = 13;
  b.g.inputs.push_back({"r", DType::kFloat32, std::vector<ir::Dim>{{2, ""}, {kC, ""}, {12, ""}, {10, ""}}});
  b.g.inputs.push_back({"t", DType::kFloat32, std::vector<ir::Dim>{{2, ""}, {kC, ""}, {6, ""}, {10, ""}}});
  auto resize = [&](const std::string& in, std::vector<float> scales, const std::string& out,
                    const std::string& coordinates) {
    b.op("Resize", {in, "", b.scalar(out + "_scales", Tensor::from_vector<float>({4}, scales))}, out);
    b.g.nodes.back().attrs = {{"mode", std::string("nearest")},
                              {"coordinate_transformation_mode", coordinates},
                              {"nearest_mode", std::string("floor")}};
  };
  resize("r", {1, 1, 2, 2}, "r_up", "asymmetric");
  b.op("Add", {"x", "r_up"}, "sum");
  b.op("QuantizeLinear", {"sum", b.scalar("cs", Tensor::from_vector<float>({kC}, {0.01f, 0.02f, 0.03f})),
                          b.scalar("cz", Tensor::from_vector<uint8_t>({kC}, {0, 128, 250}))}, "sum_q");
  resize("t", {1, 1, 4, 2}, "t_up", "asymmetric");
  b.op("Sub", {"t_up", "x"}, "difference");  // the small operand first
  b.op("QuantizeLinear", {"difference", b.scalar("ds", Tensor::scalar(0.015f)), b.scalar("dz", Tensor::scalar<int8_t>(-3))},
       "difference_q");
  resize("r", {1, 1, 2, 2}, "r_up2", "asymmetric");
  b.op("Mul", {"x", "r_up2"}, "product");  // float32 result
  resize("r", {1, 1, 2, 2}, "r_centred", "half_pixel");
  b.op("Add", {"x", "r_centred"}, "centred");
  for (const char* o : {"sum_q", "difference_q", "product", "centred"}) b.output(o);
  b.g.outputs[0].dtype = DType::kUInt8;
  b.g.outputs[1].dtype = DType::kInt8;
  runtime::Session fast(b.g), ref = reference_session(b.g);
  const std::map<std::string, Tensor> feeds = {{"x", random_tensor({2, kC, 24, 20}, 61, -3.f, 3.f)},
                                               {"r", random_tensor({2, kC, 12, 10}, 62, -3.f, 3.f)},
                                               {"t", random_tensor({2, kC, 6, 10}, 63, -3.f, 3.f)}};
  const auto got = run_hooked(fast, feeds), want = run_hooked(ref, feeds);
  for (const char* gone : {"r_up", "t_up", "r_up2", "sum", "difference"}) EXPECT_FALSE(got.count(gone)) << gone;
  EXPECT_TRUE(got.count("r_centred"));
  for (const char* v : {"sum_q", "difference_q", "product", "centred"}) expect_close(got.at(v), want.at(v), v, 0.f);
}

// The prologue folds are generic (fusions/declared_folds.h): a producer folds into all its readers
// when every one declares that prologue at the inputs reading it (KernelFolds), and into none when
// one does not. Each case against the unfused plain plan, bit for bit.
TEST(SessionFusion, AProducerFoldsIntoEveryReaderThatDeclaresItsPrologue) {
  constexpr int64_t kC = 3;
  Builder b({2, kC, 8, 6});
  b.g.inputs.push_back({"r", DType::kFloat32, std::vector<ir::Dim>{{2, ""}, {kC, ""}, {4, ""}, {3, ""}}});
  b.g.inputs.push_back({"s", DType::kFloat32, std::vector<ir::Dim>{{1, ""}, {kC, ""}, {1, ""}, {1, ""}}});
  auto upsample = [&](const std::string& out) {
    b.op("Resize", {"r", "", b.scalar(out + "_scales", Tensor::from_vector<float>({4}, {1, 1, 2, 2}))}, out);
    b.g.nodes.back().attrs = {{"mode", std::string("nearest")},
                              {"coordinate_transformation_mode", std::string("asymmetric")},
                              {"nearest_mode", std::string("floor")}};
  };
  // An upsampled value read by an Add and a Mul: both read r.
  upsample("up");
  b.op("Add", {"x", "up"}, "up_sum");
  b.op("Mul", {"up", "x"}, "up_product");
  // Another read by an Add and a Relu, which declares no prologue: the Resize stays.
  upsample("up_kept");
  b.op("Add", {"x", "up_kept"}, "kept_sum");
  b.op("Relu", {"up_kept"}, "kept_relu");
  // A per-channel scaling read by an Add and a Sub (both declare kScaledInput), and one read by a
  // Div (which does not).
  b.op("Mul", {"x", "s"}, "scaled");
  b.op("Add", {"scaled", "kept_sum"}, "scaled_sum");
  b.op("Sub", {"up_product", "scaled"}, "scaled_difference");
  b.op("Mul", {"s", "x"}, "scaled_for_div");
  b.op("Div", {"scaled_for_div", "up_sum"}, "quotient");
  // Codes read by an Add and a GlobalAveragePool (both dequantize them), and codes also read by a
  // Sigmoid (no prologue).
  auto codes = [&](const std::string& from, const std::string& out) {
    b.op("QuantizeLinear", {from, b.scalar(out + "_s", Tensor::scalar(0.02f)), b.scalar(out + "_z", Tensor::scalar<uint8_t>(128))},
         out + "_q");
    b.op("DequantizeLinear", {out + "_q", out + "_s", out + "_z"}, out);
  };
  codes("scaled_sum", "dq");
  b.op("Add", {"dq", "scaled_difference"}, "dq_sum");
  b.op("GlobalAveragePool", {"dq"}, "dq_pool");
  codes("quotient", "dq_kept");
  b.op("Add", {"dq_kept", "x"}, "dq_kept_sum");
  b.op("Sigmoid", {"dq_kept"}, "dq_kept_sigmoid");
  for (const char* o : {"up_sum", "kept_relu", "dq_sum", "dq_pool", "dq_kept_sum", "dq_kept_sigmoid"}) b.output(o);
  runtime::Session fast(b.g), ref = reference_session(b.g);
  const std::map<std::string, Tensor> feeds = {{"x", random_tensor({2, kC, 8, 6}, 71, -3.f, 3.f)},
                                               {"r", random_tensor({2, kC, 4, 3}, 72, -3.f, 3.f)},
                                               {"s", random_tensor({1, kC, 1, 1}, 73, -2.f, 2.f)}};
  const auto got = run_hooked(fast, feeds), want = run_hooked(ref, feeds);
  for (const char* gone : {"up", "scaled", "dq"}) EXPECT_FALSE(got.count(gone)) << gone;
  for (const char* stays : {"up_kept", "scaled_for_div", "dq_kept"}) EXPECT_TRUE(got.count(stays)) << stays;
  for (const char* v : {"up_sum", "kept_relu", "dq_sum", "dq_pool", "dq_kept_sum", "dq_kept_sigmoid"})
    expect_close(got.at(v), want.at(v), v, 0.f);
}
