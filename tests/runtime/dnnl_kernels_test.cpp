// oneDNN FP32 kernels: what the ONNX node conformance cases do not cover. Fused activations
// against unfused + reference activation, prepacked (constant) weights against runtime weights,
// one kernel object serving several batch sizes (primitive cache), both Conv activation layouts,
// MatMul batch broadcasting across ranks, and a few geometry corners, each checked against plain
// loop references in this file.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <random>

#include "runtime/fused_ops/fused_activation.h"
#include "runtime/kernels/dnnl/dnnl_kernels.h"
#include "slimquant/runtime/kernel.h"

namespace slimquant::runtime::dnnl_kernels {
namespace {

Tensor random_tensor(const Shape& shape, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  Tensor t(DType::kFloat32, shape);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (float& v : t.values<float>()) v = dist(gen);
  return t;
}

ir::Node make_node(const std::string& op, size_t inputs, size_t outputs = 1) {
  ir::Node n;
  n.op_type = op;
  n.name = "test_" + op;
  for (size_t i = 0; i < inputs; ++i) n.inputs.push_back("in" + std::to_string(i));
  for (size_t i = 0; i < outputs; ++i) n.outputs.push_back("out" + std::to_string(i));
  return n;
}

// One kernel object, created like the Session does (constants visible to the factory), run with
// the given inputs as often as a test likes.
class Harness {
 public:
  Harness(ir::Node node, KernelFactory factory, std::map<size_t, Tensor> constants = {}, int64_t opset = 17)
      : node_(std::move(node)), constants_(std::move(constants)) {
    KernelInit init{node_, opset, [this](size_t i) -> const Tensor* {
                      auto it = constants_.find(i);
                      return it == constants_.end() ? nullptr : &it->second;
                    }};
    kernel_ = factory(init);
  }
  // inputs[i] undefined = absent optional input; a constant input is passed too, as the Session does.
  std::vector<Tensor> run(const std::vector<Tensor>& inputs) {
    std::vector<const Tensor*> ptrs;
    for (const Tensor& t : inputs) ptrs.push_back(t.defined() ? &t : nullptr);
    std::vector<Tensor> outputs(node_.outputs.size());
    KernelContext ctx(node_, ptrs, outputs, [](DType d, const Shape& s) {
      Tensor t(d, s);
      // Poison fresh buffers: kernels must write every element (session buffers are reused).
      if (d == DType::kFloat32)
        for (float& v : t.values<float>()) v = std::nanf("");
      return t;
    });
    kernel_->run(ctx);
    return outputs;
  }

 private:
  ir::Node node_;
  std::map<size_t, Tensor> constants_;
  std::unique_ptr<Kernel> kernel_;
};

void expect_close(const Tensor& got, const Tensor& want, float tol = 1e-4f) {
  ASSERT_EQ(got.shape(), want.shape());
  auto g = got.values<float>();
  auto w = want.values<float>();
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_NEAR(g[i], w[i], tol * (1.f + std::fabs(w[i]))) << "element " << i << " of " << shape_str(want.shape());
}

// ---- plain-loop references -------------------------------------------------------------------

struct Conv2dParams {
  int64_t group = 1, stride_h = 1, stride_w = 1, dil_h = 1, dil_w = 1;
  int64_t pad_t = 0, pad_l = 0, pad_b = 0, pad_r = 0;
};

Tensor reference_conv2d(const Tensor& x, const Tensor& w, const Tensor* b, const Conv2dParams& p) {
  const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), wd = x.dim(3);
  const int64_t m = w.dim(0), cg = w.dim(1), kh = w.dim(2), kw = w.dim(3), mg = m / p.group;
  const int64_t oh = (h + p.pad_t + p.pad_b - ((kh - 1) * p.dil_h + 1)) / p.stride_h + 1;
  const int64_t ow = (wd + p.pad_l + p.pad_r - ((kw - 1) * p.dil_w + 1)) / p.stride_w + 1;
  Tensor y(DType::kFloat32, {n, m, oh, ow});
  const float* X = x.data<float>();
  const float* W = w.data<float>();
  float* Y = y.data<float>();
  for (int64_t in = 0; in < n; ++in)
    for (int64_t om = 0; om < m; ++om) {
      const int64_t g = om / mg;
      for (int64_t y0 = 0; y0 < oh; ++y0)
        for (int64_t x0 = 0; x0 < ow; ++x0) {
          double acc = b ? b->data<float>()[om] : 0.0;
          for (int64_t ic = 0; ic < cg; ++ic)
            for (int64_t ky = 0; ky < kh; ++ky)
              for (int64_t kx = 0; kx < kw; ++kx) {
                const int64_t iy = y0 * p.stride_h - p.pad_t + ky * p.dil_h;
                const int64_t ix = x0 * p.stride_w - p.pad_l + kx * p.dil_w;
                if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                acc += double(X[((in * c + g * cg + ic) * h + iy) * wd + ix]) *
                       W[((om * cg + ic) * kh + ky) * kw + kx];
              }
          Y[((in * m + om) * oh + y0) * ow + x0] = static_cast<float>(acc);
        }
    }
  (void)c;
  return y;
}

float reference_activation(const fused_ops::FusedActivation& f, float x) {
  using A = fused_ops::Activation;
  switch (f.kind) {
    case A::kRelu: return std::max(x, 0.f);
    case A::kLeakyRelu: return x >= 0 ? x : f.alpha * x;
    case A::kClip: return std::min(std::max(x, f.alpha), f.beta);
    case A::kSigmoid: return 1.f / (1.f + std::exp(-x));
    case A::kTanh: return std::tanh(x);
    case A::kHardSigmoid: return std::max(0.f, std::min(1.f, f.alpha * x + f.beta));
    case A::kHardSwish: return x * std::max(0.f, std::min(1.f, x / 6.f + 0.5f));
    case A::kElu: return x >= 0 ? x : f.alpha * (std::exp(x) - 1.f);
    case A::kGelu: return 0.5f * x * (1.f + std::erf(x / std::sqrt(2.f)));
    case A::kSwish: return x / (1.f + std::exp(-f.alpha * x));
    case A::kScale: return f.alpha * x;
    case A::kNone: return x;
  }
  return x;
}

// y[..., m, n] = sum_k a[..., m, k] * b[..., k, n] with numpy broadcasting of batch dims.
Tensor reference_matmul(const Tensor& a, const Tensor& b) {
  Shape as = a.shape(), bs = b.shape();
  const bool a_vec = as.size() == 1, b_vec = bs.size() == 1;
  if (a_vec) as.insert(as.begin(), 1);
  if (b_vec) bs.push_back(1);
  const int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
  const Shape ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
  const Shape ob = broadcast_shapes(ab, bb);
  const size_t r = ob.size();
  auto pad = [&](Shape s) {
    s.insert(s.begin(), r - s.size(), 1);
    return s;
  };
  const Shape ap = pad(ab), bp = pad(bb);
  Shape out = ob;
  if (!a_vec) out.push_back(m);
  if (!b_vec) out.push_back(n);
  Tensor y(DType::kFloat32, out);
  const int64_t batches = shape_numel(ob);
  for (int64_t bi = 0; bi < batches; ++bi) {
    int64_t rem = bi, ao = 0, bo = 0, astride = 1, bstride = 1;
    for (size_t d = r; d-- > 0;) {
      const int64_t idx = rem % ob[d];
      rem /= ob[d];
      ao += (ap[d] == 1 ? 0 : idx) * astride;
      bo += (bp[d] == 1 ? 0 : idx) * bstride;
      astride *= ap[d];
      bstride *= bp[d];
    }
    const float* A = a.data<float>() + ao * m * k;
    const float* B = b.data<float>() + bo * k * n;
    float* Y = y.data<float>() + bi * m * n;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t kk = 0; kk < k; ++kk) acc += double(A[i * k + kk]) * B[kk * n + j];
        Y[i * n + j] = static_cast<float>(acc);
      }
  }
  return y;
}

ir::Node conv_node(const Conv2dParams& p) {
  ir::Node n = make_node("Conv", 3);
  n.attrs["group"] = p.group;
  n.attrs["strides"] = std::vector<int64_t>{p.stride_h, p.stride_w};
  n.attrs["dilations"] = std::vector<int64_t>{p.dil_h, p.dil_w};
  n.attrs["pads"] = std::vector<int64_t>{p.pad_t, p.pad_l, p.pad_b, p.pad_r};
  return n;
}

// ---- Conv -------------------------------------------------------------------------------------

struct ConvCase {
  const char* name;
  Shape x, w;
  Conv2dParams p;
};

const ConvCase kConvCases[] = {
    {"plain3x3", {2, 8, 9, 9}, {16, 8, 3, 3}, {.pad_t = 1, .pad_l = 1, .pad_b = 1, .pad_r = 1}},
    {"pointwise", {2, 16, 12, 12}, {24, 16, 1, 1}, {}},
    {"depthwise",
     {1, 12, 10, 10},
     {12, 1, 3, 3},
     {.group = 12, .stride_h = 2, .stride_w = 2, .pad_t = 1, .pad_l = 1, .pad_b = 1, .pad_r = 1}},
    {"groups_dilation_asym",
     {1, 6, 11, 13},
     {9, 2, 3, 2},
     {.group = 3, .stride_h = 2, .dil_h = 2, .dil_w = 3, .pad_t = 2, .pad_l = 0, .pad_b = 1, .pad_r = 3}},
};

TEST(DnnlConv, MatchesReferenceInBothLayoutsAndBothWeightPaths) {
  for (const ConvCase& c : kConvCases) {
    SCOPED_TRACE(c.name);
    const Tensor x = random_tensor(c.x, 1), w = random_tensor(c.w, 2), b = random_tensor({c.w[0]}, 3);
    const Tensor want = reference_conv2d(x, w, &b, c.p);
    for (ConvLayout layout : {ConvLayout::kAuto, ConvLayout::kPlain, ConvLayout::kBlocked}) {
      set_conv_layout_override(layout);
      Harness packed(conv_node(c.p), make_conv, {{1, w}, {2, b}});
      Harness runtime(conv_node(c.p), make_conv);
      expect_close(packed.run({x, w, b})[0], want);
      expect_close(runtime.run({x, w, b})[0], want);
    }
    set_conv_layout_override(ConvLayout::kAuto);
  }
}

TEST(DnnlConv, NoBias) {
  const ConvCase& c = kConvCases[0];
  const Tensor x = random_tensor(c.x, 4), w = random_tensor(c.w, 5);
  ir::Node n = conv_node(c.p);
  n.inputs.pop_back();
  Harness h(n, make_conv, {{1, w}});
  expect_close(h.run({x, w})[0], reference_conv2d(x, w, nullptr, c.p));
}

TEST(DnnlConv, PrimitiveCacheServesSeveralBatchSizes) {
  const ConvCase& c = kConvCases[2];
  const Tensor w = random_tensor(c.w, 6), b = random_tensor({c.w[0]}, 7);
  Harness h(conv_node(c.p), make_conv, {{1, w}, {2, b}});
  for (int64_t batch : {1, 5, 1, 3, 5}) {
    Shape xs = c.x;
    xs[0] = batch;
    const Tensor x = random_tensor(xs, 100 + static_cast<uint32_t>(batch));
    expect_close(h.run({x, w, b})[0], reference_conv2d(x, w, &b, c.p));
  }
}

std::vector<fused_ops::FusedActivation> all_fused_activations() {
  using A = fused_ops::Activation;
  return {{A::kRelu, 0, 0},      {A::kClip, -0.5f, 0.75f},  {A::kLeakyRelu, 0.1f, 0},
          {A::kSigmoid, 0, 0},   {A::kTanh, 0, 0},          {A::kHardSigmoid, 0.2f, 0.5f},
          {A::kHardSwish, 0, 0}, {A::kElu, 0.7f, 0},        {A::kGelu, 0, 0},
          {A::kSwish, 1.f, 0},   {A::kSwish, 1.702f, 0}};
}

TEST(DnnlConv, FusedActivationsMatchUnfusedPlusActivation) {
  // Blocked layout: the activation is a post-op; plain layout: a separate in-place eltwise pass.
  for (const ConvCase& c : {kConvCases[0], kConvCases[1]}) {
    const Tensor x = random_tensor(c.x, 8, -2, 2), w = random_tensor(c.w, 9), b = random_tensor({c.w[0]}, 10);
    const Tensor unfused = Harness(conv_node(c.p), make_conv, {{1, w}, {2, b}}).run({x, w, b})[0];
    for (ConvLayout layout : {ConvLayout::kPlain, ConvLayout::kBlocked}) {
      set_conv_layout_override(layout);
      for (const fused_ops::FusedActivation& f : all_fused_activations()) {
        SCOPED_TRACE(std::string(c.name) + " " + f.name() + " layout " + std::to_string(static_cast<int>(layout)));
        ir::Node n = conv_node(c.p);
        f.write(n);
        Tensor want = unfused.clone();
        for (float& v : want.values<float>()) v = reference_activation(f, v);
        expect_close(Harness(n, make_conv, {{1, w}, {2, b}}).run({x, w, b})[0], want);
        expect_close(Harness(n, make_conv).run({x, w, b})[0], want);
      }
    }
    set_conv_layout_override(ConvLayout::kAuto);
  }
}

TEST(DnnlConv, UnknownFusedActivationIsUnsupported) {
  ir::Node n = conv_node({});
  n.attrs[fused_ops::FusedActivation::kOp] = std::string("Softplus");
  try {
    Harness h(n, make_conv);
    FAIL() << "expected kUnsupported";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("Softplus"), std::string::npos);
  }
}

TEST(DnnlConv, GroupMismatchNamesTheNode) {
  ir::Node n = conv_node({.group = 3});
  Harness h(n, make_conv);
  try {
    h.run({random_tensor({1, 4, 5, 5}, 1), random_tensor({3, 1, 3, 3}, 2), Tensor()});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("test_Conv"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("group 3"), std::string::npos) << e.what();
  }
}

// ---- ConvTranspose ----------------------------------------------------------------------------

TEST(DnnlConvTranspose, PrepackedAndRuntimeWeightsAgreeAcrossBatchSizes) {
  ir::Node n = make_node("ConvTranspose", 3);
  n.attrs["group"] = int64_t{2};
  n.attrs["strides"] = std::vector<int64_t>{2, 3};
  n.attrs["pads"] = std::vector<int64_t>{1, 0, 0, 2};
  n.attrs["output_padding"] = std::vector<int64_t>{1, 2};
  const Tensor w = random_tensor({4, 3, 3, 3}, 11), b = random_tensor({6}, 12);
  Harness packed(n, make_conv_transpose, {{1, w}, {2, b}});
  Harness runtime(n, make_conv_transpose);
  for (int64_t batch : {1, 3}) {
    const Tensor x = random_tensor({batch, 4, 5, 4}, 13);
    const Tensor a = packed.run({x, w, b})[0], r = runtime.run({x, w, b})[0];
    // out = stride*(in-1) + output_padding + k - pads
    EXPECT_EQ(a.shape(), (Shape{batch, 6, 2 * 4 + 1 + 3 - 1, 3 * 3 + 2 + 3 - 2}));
    expect_close(a, r);
  }
}

// ---- Gemm / MatMul ----------------------------------------------------------------------------

Tensor reference_gemm(const Tensor& a, const Tensor& b, const Tensor* c, bool ta, bool tb, float alpha, float beta) {
  const int64_t m = ta ? a.dim(1) : a.dim(0), k = ta ? a.dim(0) : a.dim(1), n = tb ? b.dim(0) : b.dim(1);
  Tensor y(DType::kFloat32, {m, n});
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t kk = 0; kk < k; ++kk)
        acc += double(a.data<float>()[ta ? kk * m + i : i * k + kk]) * b.data<float>()[tb ? j * k + kk : kk * n + j];
      double cv = 0;
      if (c) {
        const Shape& cs = c->shape();
        const int64_t rows = cs.size() == 2 ? cs[0] : 1, cols = cs.empty() ? 1 : cs.back();
        cv = c->data<float>()[(rows == 1 ? 0 : i) * cols + (cols == 1 ? 0 : j)];
      }
      y.data<float>()[i * n + j] = static_cast<float>(alpha * acc + beta * cv);
    }
  return y;
}

TEST(DnnlGemm, AllWeightAndBiasPathsMatchReference) {
  struct Case {
    bool ta, tb;
    float alpha, beta;
    Shape c;
  };
  const Case cases[] = {{false, true, 1.f, 1.f, {7}},     {true, false, 0.5f, 2.f, {5, 7}},
                        {false, false, 2.f, 1.f, {5, 1}}, {true, true, 1.f, 0.25f, {1}},
                        {false, true, 1.5f, 1.f, {}},     {false, false, 1.f, 0.f, {7}}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.ta) + std::to_string(c.tb) + " alpha " + std::to_string(c.alpha) + " beta " +
                 std::to_string(c.beta) + " C " + shape_str(c.c));
    ir::Node n = make_node("Gemm", 3);
    n.attrs["transA"] = int64_t{c.ta};
    n.attrs["transB"] = int64_t{c.tb};
    n.attrs["alpha"] = c.alpha;
    n.attrs["beta"] = c.beta;
    const Tensor a = random_tensor(c.ta ? Shape{4, 5} : Shape{5, 4}, 20);
    const Tensor b = random_tensor(c.tb ? Shape{7, 4} : Shape{4, 7}, 21);
    const Tensor cc = random_tensor(c.c, 22);
    const Tensor want = reference_gemm(a, b, &cc, c.ta, c.tb, c.alpha, c.beta);
    expect_close(Harness(n, make_gemm).run({a, b, cc})[0], want);
    expect_close(Harness(n, make_gemm, {{1, b}}).run({a, b, cc})[0], want);
    expect_close(Harness(n, make_gemm, {{1, b}, {2, cc}}).run({a, b, cc})[0], want);
    expect_close(Harness(n, make_gemm, {{2, cc}}).run({a, b, cc})[0], want);
  }
}

TEST(DnnlGemm, FusedActivationAndBatchSizes) {
  ir::Node n = make_node("Gemm", 3);
  n.attrs["transB"] = int64_t{1};
  n.attrs["alpha"] = 0.5f;
  const Tensor w = random_tensor({6, 8}, 30), bias = random_tensor({6}, 31);
  for (const fused_ops::FusedActivation& f : all_fused_activations()) {
    SCOPED_TRACE(f.name());
    f.write(n);
    Harness packed(n, make_gemm, {{1, w}, {2, bias}});
    Harness runtime(n, make_gemm);
    for (int64_t m : {1, 9, 1}) {
      const Tensor a = random_tensor({m, 8}, 32);
      Tensor want = reference_gemm(a, w, &bias, false, true, 0.5f, 1.f);
      for (float& v : want.values<float>()) v = reference_activation(f, v);
      expect_close(packed.run({a, w, bias})[0], want);
      expect_close(runtime.run({a, w, bias})[0], want);
    }
  }
}

// No rows (a detector's box head when its selection kept nothing): an empty output, and the same
// kernel serves rows again afterwards. oneDNN 2.6 divided by zero creating the primitive.
TEST(DnnlGemm, NoRowsGiveAnEmptyOutput) {
  ir::Node gemm = make_node("Gemm", 3);
  gemm.attrs["transB"] = int64_t{1};
  const Tensor w = random_tensor({6, 8}, 60), bias = random_tensor({6}, 61);
  Harness packed(gemm, make_gemm, {{1, w}, {2, bias}});
  Harness runtime(gemm, make_gemm);
  for (Harness* h : {&packed, &runtime}) {
    EXPECT_EQ(h->run({Tensor(DType::kFloat32, {0, 8}), w, bias})[0].shape(), (Shape{0, 6}));
    const Tensor a = random_tensor({3, 8}, 62);
    expect_close(h->run({a, w, bias})[0], reference_gemm(a, w, &bias, false, true, 1.f, 1.f));
  }
  const Tensor m = random_tensor({8, 5}, 63);
  Harness matmul(make_node("MatMul", 2), make_matmul, {{1, m}});
  EXPECT_EQ(matmul.run({Tensor(DType::kFloat32, {0, 8}), m})[0].shape(), (Shape{0, 5}));
  EXPECT_EQ(matmul.run({Tensor(DType::kFloat32, {2, 0, 8}), m})[0].shape(), (Shape{2, 0, 5}));
  const Tensor a = random_tensor({2, 8}, 64);
  expect_close(matmul.run({a, m})[0], reference_matmul(a, m));
}

TEST(DnnlMatMul, BroadcastsBatchDimsOfDifferentRanks) {
  const std::pair<Shape, Shape> cases[] = {
      {{2, 3, 4, 5}, {5, 6}},    {{3, 4, 5}, {2, 1, 5, 6}}, {{5}, {2, 5, 3}},       {{2, 3, 4}, {4}},
      {{1, 3, 4}, {2, 1, 4, 2}}, {{4}, {4}},                {{2, 1, 3, 4}, {5, 4, 3}}, {{6, 7}, {7, 2}},
  };
  for (const auto& [as, bs] : cases) {
    SCOPED_TRACE(shape_str(as) + " x " + shape_str(bs));
    const Tensor a = random_tensor(as, 40), b = random_tensor(bs, 41);
    const Tensor want = reference_matmul(a, b);
    expect_close(Harness(make_node("MatMul", 2), make_matmul).run({a, b})[0], want);
    expect_close(Harness(make_node("MatMul", 2), make_matmul, {{1, b}}).run({a, b})[0], want);
  }
}

TEST(DnnlMatMul, ConstantWeightsServeSeveralBatchSizes) {
  const Tensor w = random_tensor({16, 10}, 50);
  ir::Node n = make_node("MatMul", 2);
  fused_ops::FusedActivation{fused_ops::Activation::kRelu, 0, 0}.write(n);
  Harness h(n, make_matmul, {{1, w}});
  for (int64_t batch : {1, 4, 2, 1}) {
    const Tensor a = random_tensor({batch, 3, 16}, 51 + static_cast<uint32_t>(batch));
    Tensor want = reference_matmul(a, w);
    for (float& v : want.values<float>()) v = std::max(v, 0.f);
    expect_close(h.run({a, w})[0], want);
  }
}

// ---- pooling, normalisation -------------------------------------------------------------------

TEST(DnnlPool, AverageCountIncludePadWithCeilOverhang) {
  // 1-D: in 6, k 3, s 2, pads 1/1, ceil -> out 4; the last window [5, 8) covers input 5, the
  // explicit pad 6 and the ceil overhang 7, so it averages over 2 positions (ONNX Runtime's rule).
  ir::Node n = make_node("AveragePool", 1);
  n.attrs["kernel_shape"] = std::vector<int64_t>{3};
  n.attrs["strides"] = std::vector<int64_t>{2};
  n.attrs["pads"] = std::vector<int64_t>{1, 1};
  n.attrs["ceil_mode"] = int64_t{1};
  n.attrs["count_include_pad"] = int64_t{1};
  const Tensor x = Tensor::from_vector<float>({1, 1, 6}, {1, 2, 3, 4, 5, 6});
  const Tensor y = Harness(n, make_average_pool).run({x})[0];
  expect_close(y, Tensor::from_vector<float>({1, 1, 4}, {(0 + 1 + 2) / 3.f, (2 + 3 + 4) / 3.f, (4 + 5 + 6) / 3.f,
                                                        (6 + 0) / 2.f}));
}

TEST(DnnlPool, MaxPoolIndicesColumnMajor) {
  ir::Node n = make_node("MaxPool", 1, 2);
  n.attrs["kernel_shape"] = std::vector<int64_t>{2, 2};
  n.attrs["storage_order"] = int64_t{1};
  const Tensor x = Tensor::from_vector<float>({1, 1, 2, 3}, {1, 9, 2, 3, 4, 8});
  const auto out = Harness(n, make_max_pool).run({x});
  expect_close(out[0], Tensor::from_vector<float>({1, 1, 1, 2}, {9, 9}));
  // 9 is at (h 0, w 1): column-major index w * H + h = 2.
  EXPECT_EQ(out[1].to_int64_vector(), (std::vector<int64_t>{2, 2}));
}

TEST(DnnlLayerNorm, BroadcastScaleAndStatistics) {
  ir::Node n = make_node("LayerNormalization", 3, 3);
  n.attrs["axis"] = int64_t{1};
  n.attrs["epsilon"] = 1e-3f;
  const Tensor x = random_tensor({3, 4, 5}, 60), scale = random_tensor({5}, 61), bias = random_tensor({4, 1}, 62);
  for (bool constant : {false, true}) {
    std::map<size_t, Tensor> consts;
    if (constant) consts = {{1, scale}, {2, bias}};
    const auto out = Harness(n, make_layer_normalization, consts).run({x, scale, bias});
    for (int64_t i = 0; i < 3; ++i) {
      const float* row = x.data<float>() + i * 20;
      double mean = 0, var = 0;
      for (int j = 0; j < 20; ++j) mean += row[j];
      mean /= 20;
      for (int j = 0; j < 20; ++j) var += (row[j] - mean) * (row[j] - mean);
      var /= 20;
      const double inv = 1 / std::sqrt(var + 1e-3);
      EXPECT_NEAR(out[1].data<float>()[i], mean, 1e-5);
      EXPECT_NEAR(out[2].data<float>()[i], inv, 1e-4);
      for (int j = 0; j < 20; ++j) {
        const double want = (row[j] - mean) * inv * scale.data<float>()[j % 5] + bias.data<float>()[j / 5];
        EXPECT_NEAR(out[0].data<float>()[i * 20 + j], want, 1e-4);
      }
    }
    EXPECT_EQ(out[1].shape(), (Shape{3, 1, 1}));
  }
}

// Rows along the last axis without the statistics outputs (the own AVX-512 kernel where the CPU
// has it, oneDNN's elsewhere): row lengths around each vector count (in registers up to 64, four
// rows at a time and singly) and longer ones, with and without B, an offset far from 0 (the
// two-pass variance keeps it), against the definition in double.
TEST(DnnlLayerNorm, RowsMatchTheDefinitionInDouble) {
  for (const bool with_bias : {true, false}) {
    ir::Node n = make_node("LayerNormalization", with_bias ? 3 : 2, 1);
    n.attrs["epsilon"] = 1e-5f;
    for (const int64_t len : {1, 5, 16, 17, 33, 50, 64, 65, 197, 768}) {
      Tensor x = random_tensor({6, len}, 80 + static_cast<uint32_t>(len), -3.f, 3.f);
      for (int64_t j = 0; j < len; ++j) x.data<float>()[5 * len + j] += 1000.f;  // row 5: a large offset
      const Tensor scale = random_tensor({len}, 81), bias = random_tensor({len}, 82);
      std::vector<Tensor> inputs{x, scale};
      if (with_bias) inputs.push_back(bias);
      const Tensor y = Harness(n, make_layer_normalization, {{1, scale}}).run(inputs)[0];
      for (int64_t r = 0; r < 6; ++r) {
        const float* row = x.data<float>() + r * len;
        double mean = 0, var = 0;
        for (int64_t j = 0; j < len; ++j) mean += row[j];
        mean /= static_cast<double>(len);
        for (int64_t j = 0; j < len; ++j) var += (row[j] - mean) * (row[j] - mean);
        var /= static_cast<double>(len);
        const double inv = 1 / std::sqrt(var + 1e-5);
        for (int64_t j = 0; j < len; ++j) {
          const double normalized = (row[j] - mean) * inv;
          const double want = normalized * scale.data<float>()[j] + (with_bias ? bias.data<float>()[j] : 0.0);
          // The float sum behind the mean rounds once per addition (16 lanes of len / 16 terms, then
          // the lanes): up to (len / 16 + 16) ulps of |mean| move every deviation.
          const double sum_rounding = 0x1p-24 * static_cast<double>(len / 16 + 16) * std::fabs(mean) * inv;
          const double tolerance = 2e-6 * (1 + std::fabs(normalized)) + sum_rounding;
          EXPECT_NEAR(y.data<float>()[r * len + j], want, tolerance) << "len " << len << " row " << r << " " << j;
        }
      }
    }
  }
}

TEST(DnnlBatchNorm, TrainingModeIsUnsupported) {
  ir::Node n = make_node("BatchNormalization", 5, 3);
  n.attrs["training_mode"] = int64_t{1};
  try {
    Harness h(n, make_batch_normalization, {}, 15);
    FAIL() << "expected kUnsupported";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
  }
}

TEST(DnnlSoftmax, OpsetDecidesCoercionTo2D) {
  const Tensor x = random_tensor({2, 3, 4}, 70, -5, 5);
  ir::Node n = make_node("Softmax", 1);
  n.attrs["axis"] = int64_t{1};
  const Tensor old_style = Harness(n, make_softmax, {}, 11).run({x})[0];  // rows of 12
  const Tensor new_style = Harness(n, make_softmax, {}, 13).run({x})[0];  // along dim 1 only
  for (int64_t b = 0; b < 2; ++b) {
    double s = 0;
    for (int64_t i = 0; i < 12; ++i) s += old_style.data<float>()[b * 12 + i];
    EXPECT_NEAR(s, 1.0, 1e-5);
    for (int64_t k = 0; k < 4; ++k) {
      double t = 0;
      for (int64_t c = 0; c < 3; ++c) t += new_style.data<float>()[b * 12 + c * 4 + k];
      EXPECT_NEAR(t, 1.0, 1e-5);
    }
  }
}

// Rows along the last axis (the own AVX-512 kernel where the CPU has it, oneDNN's elsewhere): every
// row length around the 16-lane vector (a masked tail, none, rows shorter than a vector), large
// and very negative inputs, against the double-precision definition; a row holding -inf everywhere
// is NaN, as exp(x - max x) / sum makes it, and a NaN input gives a NaN.
TEST(DnnlSoftmax, ContiguousRowsMatchTheDefinitionInDouble) {
  ir::Node n = make_node("Softmax", 1);
  // Rows of at most 64 stay in registers, four at a time (rows 0-3) and singly (rows 4, 5).
  for (const int64_t len : {1, 5, 15, 16, 17, 31, 32, 33, 48, 50, 63, 64, 65, 197}) {
    Tensor x = random_tensor({6, len}, 71 + static_cast<uint32_t>(len), -30.f, 30.f);
    float* v = x.data<float>();
    v[len] = 1e30f;                 // row 1: one huge value takes (nearly) all the mass
    v[2 * len] = -1e30f;            // row 2: one value far below the rest
    for (int64_t j = 0; j < len; ++j) v[3 * len + j] = -std::numeric_limits<float>::infinity();  // row 3
    v[4 * len + len / 2] = std::numeric_limits<float>::quiet_NaN();                                // row 4
    for (int64_t j = 0; j < len; ++j) v[5 * len + j] = -100.f + 0.5f * static_cast<float>(j);   // row 5: deep exponents
    const Tensor y = Harness(n, make_softmax, {}, 13).run({x})[0];
    for (int64_t r = 0; r < 6; ++r) {
      const float* row = v + r * len;
      const float* out = y.data<float>() + r * len;
      if (r == 3) {
        for (int64_t j = 0; j < len; ++j) EXPECT_TRUE(std::isnan(out[j])) << "len " << len << " row " << r << " " << j;
        continue;
      }
      if (r == 4) {  // the NaN's own output (oneDNN's kernel keeps the row's other values finite)
        EXPECT_TRUE(std::isnan(out[len / 2])) << "len " << len;
        continue;
      }
      double m = -std::numeric_limits<double>::infinity(), sum = 0;
      for (int64_t j = 0; j < len; ++j) m = std::max(m, static_cast<double>(row[j]));
      for (int64_t j = 0; j < len; ++j) sum += std::exp(row[j] - m);
      for (int64_t j = 0; j < len; ++j) {
        // float's x - max x is exact to half an ulp of the difference: exp carries that as relative error.
        const double want = std::exp(row[j] - m) / sum;
        const double tolerance = want * (4e-7 + 6e-8 * std::fabs(row[j] - m)) + 1e-37;
        EXPECT_NEAR(out[j], want, tolerance) << "len " << len << " row " << r << " " << j;
      }
    }
  }
}

}  // namespace
}  // namespace slimquant::runtime::dnnl_kernels
