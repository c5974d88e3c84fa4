// Finite-difference checks of every backward kernel of the training engine on small random shapes.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "train/gradcheck_util.h"

namespace slimquant::test {
namespace {

using I64 = std::vector<int64_t>;
Tensor i64(const I64& v) { return Tensor::from_vector<int64_t>({static_cast<int64_t>(v.size())}, v); }
Tensor f32(float v) { return Tensor::scalar<float>(v); }

class TrainGradcheck : public ::testing::Test {
 protected:
  OneThread one_thread_;
  std::mt19937 rng{1234};
};

TEST_F(TrainGradcheck, SmoothUnaryActivations) {
  for (const char* op : {"Sigmoid", "Tanh", "Gelu", "Erf", "Exp", "Neg", "Softplus"}) {
    SCOPED_TRACE(op);
    OneNode n(op, {"x"}, {"y"}, 20);
    auto t = n.make();
    EXPECT_GT(gradcheck(*t, {random_tensor({2, 3, 5}, rng, -2.f, 2.f)}, {0}), 0);
  }
  OneNode gt("Gelu", {"x"}, {"y"}, 20);
  gt.attr("approximate", std::string("tanh"));
  auto t = gt.make();
  EXPECT_GT(gradcheck(*t, {random_tensor({4, 7}, rng, -3.f, 3.f)}, {0}), 0);
  for (const char* op : {"Sqrt", "Log", "Reciprocal"}) {
    SCOPED_TRACE(op);
    OneNode n(op, {"x"}, {"y"});
    auto u = n.make();
    EXPECT_GT(gradcheck(*u, {random_tensor({3, 4}, rng, 0.5f, 2.f)}, {0}, {.eps = 1e-3f}), 0);
  }
}

TEST_F(TrainGradcheck, PiecewiseActivationsAwayFromKinks) {
  for (const char* op : {"Relu", "LeakyRelu", "Abs"}) {
    SCOPED_TRACE(op);
    OneNode n(op, {"x"}, {"y"});
    auto t = n.make();
    EXPECT_GT(gradcheck(*t, {random_away_from_zero({2, 3, 4, 4}, rng)}, {0}), 0);
  }
  {  // HardSwish kinks at +-3, HardSigmoid (alpha 0.2, beta 0.5) at -2.5 and 2.5.
    Tensor x = random_tensor({4, 25}, rng, -5.f, 5.f);
    for (float& v : x.values<float>())
      for (float k : {-3.f, 3.f, -2.5f, 2.5f})
        if (std::fabs(v - k) < 0.05f) v = k + 0.1f;
    for (const char* op : {"HardSwish", "HardSigmoid"}) {
      SCOPED_TRACE(op);
      OneNode n(op, {"x"}, {"y"});
      auto t = n.make();
      EXPECT_GT(gradcheck(*t, {x}, {0}), 0);
    }
  }
  {  // ReLU6 as Clip with min/max inputs (opset 11+) and as attributes (opset 6).
    Tensor x = random_tensor({3, 40}, rng, -2.f, 8.f);
    for (float& v : x.values<float>())
      if (std::fabs(v) < 0.05f || std::fabs(v - 6.f) < 0.05f) v += 0.1f;
    OneNode n("Clip", {"x", "lo", "hi"}, {"y"}, 13);
    n.constant("lo", f32(0.f)).constant("hi", f32(6.f));
    auto t = n.make();
    EXPECT_GT(gradcheck(*t, {x, f32(0.f), f32(6.f)}, {0}), 0);
    OneNode a("Clip", {"x"}, {"y"}, 6);
    a.attr("min", 0.f).attr("max", 6.f);
    auto u = a.make();
    EXPECT_GT(gradcheck(*u, {x}, {0}), 0);
  }
}

TEST_F(TrainGradcheck, BroadcastingBinaryOps) {
  struct Case {
    const char* op;
    Shape a, b;
  };
  for (const Case& c : {Case{"Add", {2, 3, 4}, {4}}, Case{"Add", {2, 1, 4}, {3, 1}}, Case{"Sub", {2, 3, 4}, {2, 1, 4}},
                        Case{"Sub", {3}, {2, 3}}, Case{"Mul", {2, 3, 4}, {1, 3, 1}}, Case{"Mul", {}, {2, 3}},
                        Case{"Div", {2, 3, 4}, {3, 1}}, Case{"Div", {4}, {2, 4}}}) {
    SCOPED_TRACE(std::string(c.op) + " " + shape_str(c.a) + " " + shape_str(c.b));
    OneNode n(c.op, {"a", "b"}, {"y"});
    auto t = n.make();
    Tensor b = std::string(c.op) == "Div" ? random_tensor(c.b, rng, 0.5f, 2.f) : random_tensor(c.b, rng);
    EXPECT_GT(gradcheck(*t, {random_tensor(c.a, rng), b}, {0, 1}), 0);
  }
  {  // Pow: constant exponent (LayerNorm decompositions use x^2), and a float exponent tensor.
    OneNode n("Pow", {"a", "e"}, {"y"});
    n.constant("e", f32(2.f));
    auto t = n.make();
    EXPECT_GT(gradcheck(*t, {random_tensor({3, 5}, rng), f32(2.f)}, {0}), 0);
    OneNode m("Pow", {"a", "e"}, {"y"});
    auto u = m.make();
    EXPECT_GT(gradcheck(*u, {random_tensor({3, 5}, rng, 0.5f, 2.f), random_tensor({5}, rng, 0.5f, 2.f)}, {0, 1},
                        {.eps = 1e-3f}),
              0);
  }
  {  // Where with a constant condition broadcast over X.
    OneNode n("Where", {"c", "x", "y"}, {"z"});
    Tensor c = Tensor::from_vector<bool>({1, 4}, {true, false, false, true});
    auto t = n.make();
    EXPECT_GT(gradcheck(*t, {c, random_tensor({3, 4}, rng), random_tensor({4}, rng)}, {1, 2}), 0);
  }
}

TEST_F(TrainGradcheck, ConvPlainStridedDilatedGroupedDepthwise) {
  struct Case {
    const char* what;
    Shape x, w;
    int64_t group;
    I64 strides, pads, dilations;
    bool bias;
  };
  const Case cases[] = {
      {"3x3 pad 1 bias", {2, 3, 6, 6}, {4, 3, 3, 3}, 1, {1, 1}, {1, 1, 1, 1}, {1, 1}, true},
      {"stride 2 asymmetric pads, dilation 2", {1, 2, 9, 8}, {3, 2, 3, 2}, 1, {2, 2}, {2, 0, 1, 1}, {2, 1}, true},
      {"grouped 2", {2, 4, 5, 5}, {6, 2, 3, 3}, 2, {1, 1}, {1, 1, 1, 1}, {1, 1}, false},
      {"depthwise stride 2", {2, 4, 7, 7}, {4, 1, 3, 3}, 4, {2, 2}, {1, 1, 1, 1}, {1, 1}, true},
      {"1x1", {2, 5, 4, 4}, {3, 5, 1, 1}, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, true},
      {"1-D", {2, 3, 10}, {2, 3, 3}, 1, {2}, {1, 1}, {1}, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    OneNode n("Conv", c.bias ? std::vector<std::string>{"x", "w", "b"} : std::vector<std::string>{"x", "w"}, {"y"});
    n.attr("group", c.group).attr("strides", c.strides).attr("pads", c.pads).attr("dilations", c.dilations);
    auto t = n.make();
    std::vector<Tensor> in = {random_tensor(c.x, rng), random_tensor(c.w, rng)};
    std::vector<size_t> check = {0, 1};
    if (c.bias) {
      in.push_back(random_tensor({c.w[0]}, rng));
      check.push_back(2);
    }
    EXPECT_GT(gradcheck(*t, in, check, {.eps = 1e-2f, .rtol = 1e-2, .atol = 2e-3, .max_entries = 24}), 0);
  }
}

TEST_F(TrainGradcheck, ConvTransposePadsOutputPaddingGroups) {
  struct Case {
    const char* what;
    Shape x, w;
    int64_t group;
    std::map<std::string, ir::AttributeValue> attrs;
  };
  const Case cases[] = {
      {"stride 2, pads, output_padding 1", {2, 3, 4, 4}, {3, 2, 3, 3}, 1,
       {{"strides", I64{2, 2}}, {"pads", I64{1, 0, 1, 1}}, {"output_padding", I64{1, 0}}}},
      {"groups 2, dilation 2", {1, 4, 3, 5}, {4, 3, 2, 3}, 2, {{"dilations", I64{2, 1}}}},
      {"output_shape (SAME split)", {1, 2, 3, 3}, {2, 2, 3, 3}, 1,
       {{"strides", I64{2, 2}}, {"output_shape", I64{6, 6}}}},
      {"auto_pad SAME_UPPER", {1, 2, 3, 4}, {2, 1, 3, 2}, 1,
       {{"strides", I64{2, 2}}, {"auto_pad", std::string("SAME_UPPER")}}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    OneNode n("ConvTranspose", {"x", "w", "b"}, {"y"});
    n.attr("group", c.group);
    for (const auto& [k, v] : c.attrs) n.attr(k, v);
    auto t = n.make();
    EXPECT_GT(gradcheck(*t, {random_tensor(c.x, rng), random_tensor(c.w, rng), random_tensor({c.w[1] * c.group}, rng)},
                        {0, 1, 2}, {.eps = 1e-2f, .rtol = 1e-2, .atol = 2e-3, .max_entries = 24}),
              0);
  }
}

TEST_F(TrainGradcheck, GemmTransposesAlphaBetaBias) {
  for (int ta = 0; ta <= 1; ++ta)
    for (int tb = 0; tb <= 1; ++tb) {
      SCOPED_TRACE("transA " + std::to_string(ta) + " transB " + std::to_string(tb));
      const int64_t m = 3, k = 5, nn = 4;
      OneNode n("Gemm", {"a", "b", "c"}, {"y"}, 13);
      n.attr("transA", int64_t{ta}).attr("transB", int64_t{tb}).attr("alpha", 0.7f).attr("beta", 1.5f);
      auto t = n.make();
      Tensor a = random_tensor(ta ? Shape{k, m} : Shape{m, k}, rng);
      Tensor b = random_tensor(tb ? Shape{nn, k} : Shape{k, nn}, rng);
      Tensor c = random_tensor(ta ? Shape{nn} : Shape{m, 1}, rng);  // both broadcast directions
      EXPECT_GT(gradcheck(*t, {a, b, c}, {0, 1, 2}), 0);
    }
}

TEST_F(TrainGradcheck, MatMulBatchedBroadcastAndRank1) {
  struct Case {
    Shape a, b;
  };
  for (const Case& c : {Case{{2, 3, 4, 5}, {5, 6}}, Case{{2, 1, 3, 4}, {3, 4, 2}}, Case{{3, 4}, {2, 4, 5}},
                        Case{{4}, {2, 4, 3}}, Case{{2, 3, 4}, {4}}, Case{{2, 2, 3}, {2, 3, 2}}}) {
    SCOPED_TRACE(shape_str(c.a) + " x " + shape_str(c.b));
    OneNode n("MatMul", {"a", "b"}, {"y"});
    auto t = n.make();
    EXPECT_GT(gradcheck(*t, {random_tensor(c.a, rng), random_tensor(c.b, rng)}, {0, 1}), 0);
  }
}

TEST_F(TrainGradcheck, NormalizationsAndSoftmax) {
  {
    OneNode n("Softmax", {"x"}, {"y"}, 13);
    n.attr("axis", int64_t{1});
    auto t = n.make();
    EXPECT_GT(gradcheck(*t, {random_tensor({2, 5, 3}, rng, -2.f, 2.f)}, {0}), 0);
    OneNode l("LogSoftmax", {"x"}, {"y"}, 13);
    auto tl = l.make();
    EXPECT_GT(gradcheck(*tl, {random_tensor({3, 6}, rng, -2.f, 2.f)}, {0}), 0);
    OneNode m("Softmax", {"x"}, {"y"}, 11);  // opset < 13: softmax over the flattened dims from axis 1
    m.attr("axis", int64_t{1});
    auto u = m.make();
    EXPECT_GT(gradcheck(*u, {random_tensor({2, 3, 4}, rng, -2.f, 2.f)}, {0}), 0);
  }
  for (int64_t axis : {-1, -2}) {
    SCOPED_TRACE("LayerNormalization axis " + std::to_string(axis));
    OneNode n("LayerNormalization", {"x", "s", "b"}, {"y"});
    n.attr("axis", axis).attr("epsilon", 1e-5f);
    auto t = n.make();
    Shape norm = axis == -1 ? Shape{6} : Shape{3, 6};
    EXPECT_GT(gradcheck(*t, {random_tensor({2, 3, 6}, rng, -2.f, 2.f), random_tensor(norm, rng, 0.5f, 1.5f),
                             random_tensor(norm, rng)},
                        {0, 1, 2}, {.eps = 1e-2f, .rtol = 3e-2, .atol = 3e-3}),
              0);
  }
  {  // BatchNormalization left unfolded: frozen statistics.
    OneNode n("BatchNormalization", {"x", "s", "b", "m", "v"}, {"y"});
    n.attr("epsilon", 1e-5f);
    Tensor m = random_tensor({3}, rng), v = random_tensor({3}, rng, 0.5f, 2.f);
    n.constant("m", m).constant("v", v);
    auto t = n.make();
    EXPECT_GT(gradcheck(*t, {random_tensor({2, 3, 4, 4}, rng), random_tensor({3}, rng, 0.5f, 1.5f),
                             random_tensor({3}, rng), m, v},
                        {0, 1, 2}),
              0);
  }
}

TEST_F(TrainGradcheck, PoolingStridedPaddedCeil) {
  {
    OneNode n("MaxPool", {"x"}, {"y"});
    n.attr("kernel_shape", I64{3, 3}).attr("strides", I64{2, 2}).attr("pads", I64{1, 1, 1, 1});
    auto t = n.make();
    EXPECT_GT(gradcheck(*t, {random_distinct({2, 2, 7, 7}, rng)}, {0}, {.eps = 1e-3f}), 0);
    OneNode m("MaxPool", {"x"}, {"y"});
    m.attr("kernel_shape", I64{2, 3}).attr("strides", I64{2, 2}).attr("ceil_mode", int64_t{1}).attr("dilations", I64{1, 2});
    auto u = m.make();
    EXPECT_GT(gradcheck(*u, {random_distinct({1, 2, 7, 9}, rng)}, {0}, {.eps = 1e-3f}), 0);
  }
  for (int64_t include : {0, 1})
    for (int64_t ceil : {0, 1}) {
      SCOPED_TRACE("AveragePool count_include_pad " + std::to_string(include) + " ceil_mode " + std::to_string(ceil));
      OneNode n("AveragePool", {"x"}, {"y"});
      n.attr("kernel_shape", I64{3, 3}).attr("strides", I64{2, 2}).attr("pads", I64{1, 0, 1, 1});
      n.attr("count_include_pad", include).attr("ceil_mode", ceil);
      auto t = n.make();
      EXPECT_GT(gradcheck(*t, {random_tensor({2, 2, 6, 7}, rng)}, {0}), 0);
    }
  for (const char* op : {"GlobalAveragePool", "GlobalMaxPool"}) {
    SCOPED_TRACE(op);
    OneNode n(op, {"x"}, {"y"});
    auto t = n.make();
    EXPECT_GT(gradcheck(*t, {random_distinct({2, 3, 4, 5}, rng)}, {0}, {.eps = 1e-3f}), 0);
  }
  {
    OneNode n("ReduceMean", {"x"}, {"y"}, 13);
    n.attr("axes", I64{1, -1}).attr("keepdims", int64_t{0});
    auto t = n.make();
    EXPECT_GT(gradcheck(*t, {random_tensor({2, 3, 4, 5}, rng)}, {0}), 0);
    OneNode m("ReduceSum", {"x", "axes"}, {"y"}, 13);
    m.constant("axes", i64({0, 2}));
    auto u = m.make();
    EXPECT_GT(gradcheck(*u, {random_tensor({2, 3, 4}, rng), i64({0, 2})}, {0}), 0);
  }
}

TEST_F(TrainGradcheck, ShapeAndDataMovementOps) {
  {
    OneNode n("Reshape", {"x", "s"}, {"y"});
    n.constant("s", i64({4, -1}));
    auto t = n.make();
    auto g = t->forward({random_tensor({2, 3, 4}, rng), i64({4, -1})}, true);
    EXPECT_EQ(g[0].shape(), (Shape{4, 6}));
    t->backward({Tensor()});  // no gradient in, none out
    EXPECT_GT(gradcheck(*t, {random_tensor({2, 3, 4}, rng), i64({4, -1})}, {0}), 0);
  }
  {
    OneNode n("Flatten", {"x"}, {"y"});
    n.attr("axis", int64_t{2});
    auto t = n.make();
    EXPECT_GT(gradcheck(*t, {random_tensor({2, 3, 2, 2}, rng)}, {0}), 0);
    OneNode u("Unsqueeze", {"x", "a"}, {"y"});
    auto tu = u.constant("a", i64({0, 3})).make();
    EXPECT_GT(gradcheck(*tu, {random_tensor({2, 3}, rng), i64({0, 3})}, {0}), 0);
    OneNode s("Squeeze", {"x", "a"}, {"y"});
    auto ts = s.constant("a", i64({1})).make();
    EXPECT_GT(gradcheck(*ts, {random_tensor({2, 1, 3}, rng), i64({1})}, {0}), 0);
  }
  {
    OneNode n("Transpose", {"x"}, {"y"});
    n.attr("perm", I64{2, 0, 3, 1});
    auto t = n.make();
    EXPECT_GT(gradcheck(*t, {random_tensor({2, 3, 4, 5}, rng)}, {0}), 0);
  }
  {
    OneNode n("Concat", {"a", "b", "c"}, {"y"});
    n.attr("axis", int64_t{-2});
    auto t = n.make();
    EXPECT_GT(gradcheck(*t, {random_tensor({2, 1, 3}, rng), random_tensor({2, 4, 3}, rng), random_tensor({2, 2, 3}, rng)},
                        {0, 1, 2}),
              0);
    OneNode s("Split", {"x", "sp"}, {"p", "q"}, 13);
    s.attr("axis", int64_t{1}).constant("sp", i64({1, 3}));
    auto ts = s.make();
    EXPECT_GT(gradcheck(*ts, {random_tensor({2, 4, 3}, rng), i64({1, 3})}, {0}), 0);
  }
  {
    OneNode n("Slice", {"x", "st", "en", "ax", "sp"}, {"y"}, 13);
    auto t = n.make();
    // x[:, -1:0:-2, 1:] (negative step) over [2, 6, 5].
    EXPECT_GT(gradcheck(*t, {random_tensor({2, 6, 5}, rng), i64({-1, 1}), i64({0, 100}), i64({1, 2}), i64({-2, 1})},
                        {0}),
              0);
  }
  {
    OneNode n("Gather", {"x", "i"}, {"y"});
    n.attr("axis", int64_t{1});
    Tensor idx = Tensor::from_vector<int64_t>({2, 2}, {0, 2, -1, 0});  // repeated index 0 and a negative one
    auto t = n.make();
    EXPECT_GT(gradcheck(*t, {random_tensor({2, 3, 4}, rng), idx}, {0}), 0);
    OneNode s("Gather", {"x", "i"}, {"y"});
    s.attr("axis", int64_t{1});
    auto ts = s.make();  // scalar index: x[:, 0] (the ViT class token)
    EXPECT_GT(gradcheck(*ts, {random_tensor({2, 5, 3}, rng), Tensor::scalar<int64_t>(0)}, {0}), 0);
  }
  {  // Resize, nearest: 2x upsampling (scales) and a non-integer ratio (sizes 3x3 -> 5x4).
    OneNode up("Resize", {"x", "", "s"}, {"y"}, 13);
    up.attr("mode", std::string("nearest"));
    up.constant("s", Tensor::from_vector<float>({4}, {1, 1, 2, 2}));
    auto tu = up.make();
    EXPECT_GT(gradcheck(*tu, {random_tensor({2, 3, 2, 3}, rng), Tensor(), Tensor::from_vector<float>({4}, {1, 1, 2, 2})}, {0}), 0);
    OneNode odd("Resize", {"x", "", "", "z"}, {"y"}, 13);
    odd.attr("mode", std::string("nearest"));
    odd.constant("z", i64({1, 2, 5, 4}));
    auto to = odd.make();
    EXPECT_GT(gradcheck(*to, {random_tensor({1, 2, 3, 3}, rng), Tensor(), Tensor(), i64({1, 2, 5, 4})}, {0}), 0);
    OneNode lin("Resize", {"x", "", "s"}, {"y"}, 13);
    lin.attr("mode", std::string("linear"));
    lin.constant("s", Tensor::from_vector<float>({4}, {1, 1, 2, 2}));
    auto tl = lin.make();
    EXPECT_THROW(gradcheck(*tl, {random_tensor({1, 1, 2, 2}, rng), Tensor(), Tensor::from_vector<float>({4}, {1, 1, 2, 2})}, {0}), Error);
  }
  {  // Pad: zero padding on two axes, a crop (negative pad) on the last.
    OneNode n("Pad", {"x", "p"}, {"y"}, 13);
    const I64 pads = {0, 1, 2, 0, 2, -1};
    n.constant("p", i64(pads));
    auto t = n.make();
    EXPECT_GT(gradcheck(*t, {random_tensor({2, 3, 4}, rng), i64(pads)}, {0}), 0);
  }
  {
    OneNode n("Expand", {"x", "s"}, {"y"});
    auto t = n.make();
    EXPECT_GT(gradcheck(*t, {random_tensor({1, 1, 3}, rng), i64({4, 2, 3})}, {0}), 0);
  }
}

// The harness itself must catch a wrong backward: y = x^2 whose backward claims dy/dx = x.
class WrongSquare final : public train::TrainOp {
 public:
  std::vector<Tensor> forward(const std::vector<Tensor>& in, bool training) override {
    Tensor y = in[0].clone();
    for (float& v : y.values<float>()) v *= v;
    if (training) x_ = in[0];
    return {y};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& gy) override {
    Tensor dx = gy[0].clone();
    for (int64_t i = 0; i < dx.numel(); ++i) dx.data<float>()[i] *= x_.data<float>()[i];  // missing factor 2
    return {dx};
  }

 private:
  Tensor x_;
};

TEST_F(TrainGradcheck, HarnessRejectsAWrongBackward) {
  WrongSquare op;
  Tensor x = random_away_from_zero({1}, rng, 1.f, 0.3f);  // one entry: exactly one failure
  EXPECT_NONFATAL_FAILURE(gradcheck(op, {x}, {0}), "entry");
}

TEST_F(TrainGradcheck, ShapeOpsCarryNoGradient) {
  OneNode n("Shape", {"x"}, {"y"});
  auto t = n.make();
  auto y = t->forward({random_tensor({2, 3}, rng)}, true);
  ASSERT_EQ(y[0].to_int64_vector(), (I64{2, 3}));
  auto g = t->backward({Tensor()});
  ASSERT_EQ(g.size(), 1u);
  EXPECT_FALSE(g[0].defined());
}

TEST_F(TrainGradcheck, UnsupportedOpNamesOpAndNode) {
  OneNode n("TopK", {"x", "k"}, {"v", "i"});
  n.node.name = "my_topk";
  try {
    n.make();
    FAIL() << "expected kUnsupported";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("TopK"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("my_topk"), std::string::npos) << e.what();
  }
}

TEST_F(TrainGradcheck, BackwardWithoutTrainingForwardIsAnError) {
  OneNode n("Relu", {"x"}, {"y"});
  auto t = n.make();
  t->forward({random_tensor({3}, rng)}, false);
  EXPECT_THROW(t->backward({random_tensor({3}, rng)}), Error);
}

}  // namespace
}  // namespace slimquant::test
