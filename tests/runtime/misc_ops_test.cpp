// Misc math kernels (InstanceNormalization, Hardmax, CumSum, Einsum): closed-form checks the ONNX
// node test data misses — a zero-variance channel, hand-computed batched products, Einsum's
// transposed-read / diagonal / broadcast paths against a plain summation loop, the opset change
// of Hardmax, and malformed equations reported as malformed nodes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "kernel_test_util.h"
#include "slimquant/runtime/kernel.h"

namespace slimquant::runtime {
namespace {

using kernel_test::make_node;
using kernel_test::run1;

ir::Node einsum_node(const std::string& equation, size_t n_inputs) {
  ir::Node n = make_node("Einsum", n_inputs);
  n.attrs["equation"] = equation;
  return n;
}

Tensor random_tensor(const Shape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  Tensor t(DType::kFloat32, s);
  for (float& v : t.values<float>()) v = dist(rng);
  return t;
}

// ---- InstanceNormalization ---------------------------------------------------------------------

TEST(InstanceNormalization, ConstantChannelGivesExactlyTheBias) {
  // Channel 0 is constant (variance 0): (x - mean) is exactly 0, so y is exactly B whatever the
  // scale. Channel 1 = {1, 2, 3}: mean 2, variance 2/3.
  const Tensor x = Tensor::from_vector<float>({1, 2, 3}, {0.7f, 0.7f, 0.7f, 1.f, 2.f, 3.f});
  const Tensor scale = Tensor::from_vector<float>({2}, {5.f, 3.f});
  const Tensor bias = Tensor::from_vector<float>({2}, {0.25f, -1.f});
  ir::Node node = make_node("InstanceNormalization", 3);
  node.attrs["epsilon"] = 1e-5f;
  const Tensor y = run1(node, 9, {x, scale, bias});
  ASSERT_EQ(y.shape(), (Shape{1, 2, 3}));
  const float* py = y.data<float>();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(py[i], 0.25f) << i;
  const double inv_std = 1.0 / std::sqrt(2.0 / 3.0 + 1e-5);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(py[3 + i], 3.0 * (i + 1 - 2) * inv_std - 1.0, 1e-5) << i;
}

// ---- Hardmax -----------------------------------------------------------------------------------

TEST(Hardmax, Opset11CoercesTo2DAndOpset13UsesOneAxis) {
  // [1, 2, 2] with axis 1. Opset 11: one row of 4 -> one 1 at the global max (index 3).
  // Opset 13: along dim 1 only -> a 1 per column; ties keep the first maximum.
  const Tensor x = Tensor::from_vector<float>({1, 2, 2}, {5.f, 1.f, 5.f, 6.f});
  ir::Node node = make_node("Hardmax", 1);
  node.attrs["axis"] = int64_t{1};
  const Tensor y11 = run1(node, 11, {x});
  EXPECT_EQ(std::vector<float>(y11.values<float>().begin(), y11.values<float>().end()),
            (std::vector<float>{0.f, 0.f, 0.f, 1.f}));
  const Tensor y13 = run1(node, 13, {x});
  EXPECT_EQ(std::vector<float>(y13.values<float>().begin(), y13.values<float>().end()),
            (std::vector<float>{1.f, 0.f, 0.f, 1.f}));
}

// ---- CumSum ------------------------------------------------------------------------------------

TEST(CumSum, Int64ExclusiveReverseAlongAxis1) {
  const Tensor x = Tensor::from_vector<int64_t>({2, 3}, {1, 2, 3, 4, 5, 6});
  ir::Node node = make_node("CumSum", 2);
  node.attrs["exclusive"] = int64_t{1};
  node.attrs["reverse"] = int64_t{1};
  const Tensor y = run1(node, 14, {x, Tensor::scalar<int32_t>(-1)});
  EXPECT_EQ(std::vector<int64_t>(y.values<int64_t>().begin(), y.values<int64_t>().end()),
            (std::vector<int64_t>{5, 3, 0, 11, 6, 0}));
}

// ---- Einsum ------------------------------------------------------------------------------------

TEST(Einsum, BatchMatmulHandComputed2x2) {
  // Batch 0: [[1,2],[3,4]] x [[5,6],[7,8]] = [[19,22],[43,50]];
  // batch 1: [[1,0],[0,-1]] x [[2,3],[4,5]] = [[2,3],[-4,-5]].
  const std::vector<float> a = {1, 2, 3, 4, 1, 0, 0, -1}, b = {5, 6, 7, 8, 2, 3, 4, 5};
  const std::vector<float> want = {19, 22, 43, 50, 2, 3, -4, -5};
  const ir::Node node = einsum_node("bij,bjk->bik", 2);
  const Tensor y = run1(node, 12, {Tensor::from_vector<float>({2, 2, 2}, a), Tensor::from_vector<float>({2, 2, 2}, b)});
  ASSERT_EQ(y.shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(std::vector<float>(y.values<float>().begin(), y.values<float>().end()), want);

  // The same product on the integer path (plain loop instead of sgemm).
  std::vector<int64_t> ai(a.begin(), a.end()), bi(b.begin(), b.end()), wi(want.begin(), want.end());
  const Tensor yi = run1(node, 12, {Tensor::from_vector<int64_t>({2, 2, 2}, ai), Tensor::from_vector<int64_t>({2, 2, 2}, bi)});
  EXPECT_EQ(std::vector<int64_t>(yi.values<int64_t>().begin(), yi.values<int64_t>().end()), wi);
}

// Plain summation over every assignment of every label: the obviously-correct reference, for
// explicit equations without "..." (labels are single letters; extents from the shapes).
Tensor reference_einsum(const std::string& equation, const std::vector<Tensor>& inputs) {
  const size_t arrow = equation.find("->");
  std::vector<std::string> terms;
  for (size_t start = 0;;) {
    const size_t comma = equation.find(',', start);
    terms.push_back(equation.substr(start, std::min(comma, arrow) - start));
    if (comma == std::string::npos || comma > arrow) break;
    start = comma + 1;
  }
  const std::string out = equation.substr(arrow + 2);
  std::map<char, int64_t> extent;
  for (size_t i = 0; i < terms.size(); ++i)
    for (size_t d = 0; d < terms[i].size(); ++d) extent[terms[i][d]] = inputs[i].dim(d);
  std::vector<char> letters;
  for (const auto& [c, e] : extent) letters.push_back(c);
  Shape out_shape;
  for (char c : out) out_shape.push_back(extent[c]);
  Tensor y(DType::kFloat32, out_shape);
  std::map<char, int64_t> at;
  for (char c : letters) at[c] = 0;
  auto offset = [&](const std::string& labels, const Shape& shape) {
    int64_t o = 0;
    for (size_t d = 0; d < labels.size(); ++d) o = o * shape[d] + at[labels[d]];
    return o;
  };
  int64_t assignments = 1;
  for (char c : letters) assignments *= extent[c];
  for (int64_t n = 0; n < assignments; ++n) {
    int64_t rem = n;
    for (size_t i = letters.size(); i-- > 0;) {
      at[letters[i]] = rem % extent[letters[i]];
      rem /= extent[letters[i]];
    }
    double prod = 1.0;
    for (size_t i = 0; i < terms.size(); ++i) prod *= inputs[i].data<float>()[offset(terms[i], inputs[i].shape())];
    y.data<float>()[offset(out, out_shape)] += static_cast<float>(prod);
  }
  return y;
}

TEST(Einsum, MatchesPlainSummation) {
  struct Case {
    std::string equation;
    std::vector<Shape> shapes;
  };
  const std::vector<Case> cases = {
      {"bhqd,bhkd->bhqk", {{2, 3, 4, 5}, {2, 3, 6, 5}}},  // B read transposed, no copy
      {"bkm,bkn->bmn", {{3, 4, 5}, {3, 4, 2}}},           // A read transposed
      {"ij,jk,kl->il", {{2, 3}, {3, 4}, {4, 5}}},         // chain of three
      {"i,j->ij", {{3}, {4}}},                            // outer product (K empty)
      {"iij,jk->ik", {{3, 3, 4}, {4, 2}}},                // diagonal, then contraction
      {"ii->i", {{4, 4}}},                                // diagonal
      {"ii->", {{4, 4}}},                                 // trace
      {"abc->ca", {{2, 3, 4}}},                           // sum over b + transpose
      {"ab,ab->ab", {{3, 4}, {3, 4}}},                    // elementwise (all batch)
      {"ij,ij->", {{3, 4}, {3, 4}}},                      // full contraction
      {"ijk,ikl->", {{2, 3, 4}, {2, 4, 3}}},              // summed batch
      {"ab,cd->", {{2, 3}, {4, 5}}},                      // sums before the product
  };
  uint32_t seed = 1;
  for (const Case& c : cases) {
    std::vector<Tensor> inputs;
    for (const Shape& s : c.shapes) inputs.push_back(random_tensor(s, seed++));
    const Tensor y = run1(einsum_node(c.equation, inputs.size()), 12, inputs);
    const Tensor want = reference_einsum(c.equation, inputs);
    ASSERT_EQ(y.shape(), want.shape()) << c.equation;
    for (int64_t i = 0; i < want.numel(); ++i)
      EXPECT_NEAR(y.data<float>()[i], want.data<float>()[i], 1e-4) << c.equation << " element " << i;
  }
}

TEST(Einsum, ImplicitOutputAndEllipsisBroadcast) {
  // Implicit "ij,jk": output "ik" (letters occurring once, in order).
  const Tensor a = random_tensor({2, 3}, 7), b = random_tensor({3, 4}, 8);
  const Tensor implicit = run1(einsum_node("ij,jk", 2), 12, {a, b});
  const Tensor explicit_out = run1(einsum_node("ij,jk->ik", 2), 12, {a, b});
  ASSERT_EQ(implicit.shape(), (Shape{2, 4}));
  for (int64_t i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(implicit.data<float>()[i], explicit_out.data<float>()[i]);

  // "...ij,...jk->...ik" with batch dims [2, 1] against [3]: broadcast to [2, 3].
  const Tensor x = random_tensor({2, 1, 2, 3}, 9), w = random_tensor({3, 3, 4}, 10);
  const Tensor y = run1(einsum_node("...ij, ...jk -> ...ik", 2), 12, {x, w});
  ASSERT_EQ(y.shape(), (Shape{2, 3, 2, 4}));
  for (int64_t p = 0; p < 2; ++p)
    for (int64_t q = 0; q < 3; ++q)
      for (int64_t i = 0; i < 2; ++i)
        for (int64_t k = 0; k < 4; ++k) {
          double s = 0;
          for (int64_t j = 0; j < 3; ++j) s += x.data<float>()[(p * 2 + i) * 3 + j] * w.data<float>()[(q * 3 + j) * 4 + k];
          EXPECT_NEAR(y.data<float>()[((p * 3 + q) * 2 + i) * 4 + k], s, 1e-5);
        }
}

TEST(Einsum, MalformedEquationIsAnInvalidModelNamingTheNode) {
  const std::vector<std::pair<std::string, size_t>> malformed = {
      {"ij,j$k->ik", 2},  // invalid character
      {"i.j->ij", 1},     // lone '.'
      {"...i...->i", 1},  // two ellipses in a term
      {"ij->ii", 1},      // output label twice
      {"ij->k", 1},       // output label in no input
      {"ij->i->j", 1},    // two arrows
      {"ij,jk->ik", 1},   // two terms for one input
  };
  for (const auto& [equation, n_inputs] : malformed) {
    const ir::Node node = einsum_node(equation, n_inputs);
    const KernelFactory* f = KernelRegistry::instance().find("Einsum");
    ASSERT_NE(f, nullptr);
    KernelInit init{node, 12, [](size_t) -> const Tensor* { return nullptr; }};
    try {
      (*f)(init);
      ADD_FAILURE() << "accepted '" << equation << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidModel) << equation << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("/Einsum_0"), std::string::npos) << e.what();
    }
  }
}

TEST(Einsum, ExtentMismatchIsAnInvalidArgument) {
  const ir::Node node = einsum_node("ij,jk->ik", 2);
  try {
    run1(node, 12, {random_tensor({2, 3}, 1), random_tensor({4, 3}, 2)});
    ADD_FAILURE() << "accepted mismatched extents";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("label j"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace slimquant::runtime
