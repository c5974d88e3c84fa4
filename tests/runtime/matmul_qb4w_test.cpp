// 4-bit blocked weights in the runtime: the opset-21 blocked DequantizeLinear, and the fused
// MatMulQb4w kernel that reads the 4-bit codes, against the unfused DequantizeLinear + MatMul and
// a plain double-precision loop.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>

#include "graph_builder.h"
#include "runtime/fusions/execution_fusions.h"
#include "slimquant/runtime/session.h"

using namespace slimquant;

namespace {

struct Case {
  int64_t m, k, n, block;
  bool gemm_transposed;  // Gemm(transB = 1) with a bias, codes [N, K], axis 1; else MatMul, [K, N], axis 0
};

struct Built {
  ir::Graph g;
  Tensor codes, scales, bias;
};

// closed_form: codes, scales and bias chosen so that every product and partial sum is exact in
// float (small integers times powers of two), instead of random ones.
Built blocked_matmul(const Case& c, std::mt19937& rng, bool closed_form = false) {
  test::GraphBuilder b;
  b.g.opset = 21;
  b.g.ir_version = 10;
  const int64_t kb = (c.k + c.block - 1) / c.block;
  Built out;
  out.codes = Tensor(DType::kInt8, c.gemm_transposed ? Shape{c.n, c.k} : Shape{c.k, c.n});
  std::uniform_int_distribution<int> code(-8, 7);
  for (auto& v : out.codes.values<int8_t>()) v = static_cast<int8_t>(code(rng));
  out.scales = test::random_tensor(c.gemm_transposed ? Shape{c.n, kb} : Shape{kb, c.n}, rng, 0.01f, 0.1f);
  if (closed_form) {
    for (int64_t k = 0; k < c.k; ++k)
      for (int64_t j = 0; j < c.n; ++j)
        out.codes.data<int8_t>()[c.gemm_transposed ? j * c.k + k : k * c.n + j] =
            static_cast<int8_t>((k * 7 + j * 3) % 16 - 8);
    for (int64_t b = 0; b < kb; ++b)
      for (int64_t j = 0; j < c.n; ++j)
        out.scales.data<float>()[c.gemm_transposed ? j * kb + b : b * c.n + j] = std::ldexp(1.f, -static_cast<int>((b + j) % 3) - 1);
  }
  const std::string codes = b.constant(out.codes), scales = b.constant(out.scales);
  b.g.stored_4bit_types[codes] = 22;
  const std::string w = b.node("DequantizeLinear", {codes, scales},
                               {{"axis", int64_t{c.gemm_transposed ? 1 : 0}}, {"block_size", c.block}});
  std::string y;
  if (c.gemm_transposed) {
    out.bias = test::random_tensor({c.n}, rng);
    if (closed_form)
      for (int64_t j = 0; j < c.n; ++j) out.bias.data<float>()[j] = static_cast<float>(j % 7) - 3.f;
    y = b.node("Gemm", {"a", w, b.constant(out.bias)}, {{"transB", int64_t{1}}});
  } else {
    y = b.node("MatMul", {"a", w});
  }
  b.g.inputs = {ir::ValueInfo{"a", DType::kFloat32, std::nullopt}};
  b.g.outputs = {ir::ValueInfo{y, DType::kFloat32, std::nullopt}};
  out.g = std::move(b.g);
  return out;
}

// y = a . dequantize(codes, scales) (+ bias), in double.
std::vector<double> reference(const Case& c, const Built& b, const Tensor& a) {
  const int64_t kb = (c.k + c.block - 1) / c.block;
  std::vector<double> y(static_cast<size_t>(c.m * c.n), 0.0);
  for (int64_t r = 0; r < c.m; ++r)
    for (int64_t j = 0; j < c.n; ++j) {
      double acc = b.bias.defined() ? b.bias.data<float>()[j] : 0.0;
      for (int64_t k = 0; k < c.k; ++k) {
        const double q = c.gemm_transposed ? b.codes.data<int8_t>()[j * c.k + k] : b.codes.data<int8_t>()[k * c.n + j];
        const double s = c.gemm_transposed ? b.scales.data<float>()[j * kb + k / c.block]
                                           : b.scales.data<float>()[(k / c.block) * c.n + j];
        acc += a.data<float>()[r * c.k + k] * q * s;
      }
      y[static_cast<size_t>(r * c.n + j)] = acc;
    }
  return y;
}

void expect_fused_equals_unfused() {
  std::mt19937 rng(7);
  // K a multiple of the block and not (the last block shorter, as ONNX allows: scales take
  // ceil(K / block_size) blocks), K below 32, batch 1, a few rows (the 4-bit dot products) and many
  // (dequantized panels through sgemm). The kernel packs K in chunks of 128 inputs, then groups of
  // 32: K = 64 and 20 are groups only, 512 and 384 chunks only, 515 / 777 / 200 both (odd K, K not
  // a multiple of the block); blocks of 32, 64, 128 and 256 share a scale table per 1, 2 and 4
  // groups of 32 in the AVX-512 loop, 96 straddles its chunks; up to 8 rows of A (the most the dot
  // products take) with and without a bias.
  for (const Case c :
       {Case{1, 64, 48, 32, false}, Case{1, 100, 33, 32, false}, Case{3, 200, 17, 64, true}, Case{1, 20, 5, 32, true},
        Case{20, 256, 300, 128, false}, Case{9, 130, 40, 64, true}, Case{1, 1000, 70, 128, true},
        Case{1, 512, 24, 32, false}, Case{2, 515, 19, 64, true}, Case{8, 384, 16, 128, false},
        Case{5, 777, 13, 96, true}, Case{1, 1024, 9, 256, false}, Case{4, 4096, 6, 32, true}}) {
    SCOPED_TRACE("m " + std::to_string(c.m) + " k " + std::to_string(c.k) + " n " + std::to_string(c.n) + " block " +
                 std::to_string(c.block) + (c.gemm_transposed ? " Gemm" : " MatMul"));
    const Built built = blocked_matmul(c, rng);
    // Structure: the plan's fusion turns DequantizeLinear + MatMul / Gemm into one node.
    ir::Graph fused_graph = built.g;
    const ir::RuleCounts counts = runtime::apply_execution_fusions(fused_graph, {});
    EXPECT_EQ(ir::count_of(counts, "fold_blocked_dequantize_into_matmul"), 1);
    ASSERT_EQ(fused_graph.nodes.size(), 1u);
    EXPECT_EQ(fused_graph.nodes[0].op_type, "MatMulQb4w");

    const Tensor a = test::random_tensor({c.m, c.k}, rng);
    runtime::SessionOptions plain;
    plain.fuse_activations = false;  // no execution fusions: DequantizeLinear, then MatMul / Gemm
    runtime::Session fused(built.g), unfused(built.g, plain);
    const Tensor got = fused.run({{"a", a}}).begin()->second;
    const Tensor want = unfused.run({{"a", a}}).begin()->second;
    const std::vector<double> exact = reference(c, built, a);
    ASSERT_EQ(got.shape(), (Shape{c.m, c.n}));
    ASSERT_EQ(want.shape(), got.shape());
    double magnitude = 0;
    for (double v : exact) magnitude = std::max(magnitude, std::abs(v));
    // Float rounding of K products, taken in a different order: a few ulps of the row's magnitude.
    const double bound = 4e-6 * std::sqrt(static_cast<double>(c.k)) * (magnitude + 1.0);
    for (int64_t i = 0; i < got.numel(); ++i) {
      EXPECT_NEAR(got.data<float>()[i], want.data<float>()[i], bound) << i;
      EXPECT_NEAR(got.data<float>()[i], exact[static_cast<size_t>(i)], bound) << i;
    }
  }
}

// Small integers times powers of two: every path's sum is exact, whatever its order, so the fused
// kernel must equal sum_k a_k q_k s_k (+ bias) exactly; a code read from the wrong nibble, a scale
// from the wrong block or a padding code that is not 0 shows as a difference.
void expect_closed_form_exact() {
  std::mt19937 rng(11);
  for (const Case c : {Case{1, 300, 7, 32, false}, Case{3, 515, 5, 64, true}, Case{8, 256, 4, 128, false},
                       Case{2, 777, 3, 96, true}, Case{1, 20, 6, 32, false}, Case{12, 160, 5, 32, true}}) {
    SCOPED_TRACE("m " + std::to_string(c.m) + " k " + std::to_string(c.k) + " n " + std::to_string(c.n) + " block " +
                 std::to_string(c.block) + (c.gemm_transposed ? " Gemm" : " MatMul"));
    const Built built = blocked_matmul(c, rng, true);
    Tensor a(DType::kFloat32, Shape{c.m, c.k});
    for (int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] = static_cast<float>(i % 5) - 2.f;
    runtime::Session fused(built.g);
    const Tensor got = fused.run({{"a", a}}).begin()->second;
    const std::vector<double> exact = reference(c, built, a);
    ASSERT_EQ(got.shape(), (Shape{c.m, c.n}));
    for (int64_t i = 0; i < got.numel(); ++i) EXPECT_EQ(got.data<float>()[i], exact[static_cast<size_t>(i)]) << i;
  }
}

TEST(MatMulQb4w, ClosedFormSumsAreExactOnEveryPath) {
  for (const char* isa : {"avx512", "avx2", "scalar"}) {
    SCOPED_TRACE(isa);
    setenv("SLIMQUANT_QB4W_ISA", isa, 1);
    expect_closed_form_exact();
  }
  unsetenv("SLIMQUANT_QB4W_ISA");
}

TEST(MatMulQb4w, FusedKernelEqualsDequantizeLinearThenMatMul) {
  // Every ISA path this CPU can run (SLIMQUANT_QB4W_ISA caps the kernel's choice at creation).
  for (const char* isa : {"avx512", "avx2", "scalar"}) {
    SCOPED_TRACE(isa);
    setenv("SLIMQUANT_QB4W_ISA", isa, 1);
    expect_fused_equals_unfused();
  }
  unsetenv("SLIMQUANT_QB4W_ISA");
}

// The same product with A rounded to int8 per group of 32 (s_a = max|a| / 127, to nearest even), in
// double: what the kernel computes with slimquant.int4_activations = "int8" (ONNX Runtime's
// MatMulNBits at accuracy level 4).
std::vector<double> reference_int8_activations(const Case& c, const Built& b, const Tensor& a) {
  Tensor rounded(DType::kFloat32, a.shape());
  for (int64_t r = 0; r < c.m; ++r)
    for (int64_t k0 = 0; k0 < c.k; k0 += 32) {
      const int64_t k1 = std::min(c.k, k0 + 32);
      float amax = 0.f;
      for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(a.data<float>()[r * c.k + k]));
      const double scale = amax / 127.0;
      for (int64_t k = k0; k < k1; ++k) {
        const float x = a.data<float>()[r * c.k + k];
        rounded.data<float>()[r * c.k + k] =
            amax > 0.f ? static_cast<float>(std::nearbyint(x * (127.f / amax)) * scale) : 0.f;
      }
    }
  return reference(c, b, rounded);
}

// slimquant.int4_activations = "int8": the fusion marks the node, the kernel equals the int8
// reference above on every ISA path (K with partial groups and pairs, every block size, 1-8 rows);
// more than 8 rows run the exact float path; and the rounding stays near the exact product.
TEST(MatMulQb4w, Int8ActivationsEqualTheirClosedFormOnEveryPath) {
  for (const char* isa : {"avx2", "scalar"}) {
    SCOPED_TRACE(isa);
    setenv("SLIMQUANT_QB4W_ISA", isa, 1);
    std::mt19937 rng(5);
    for (const Case c : {Case{1, 64, 48, 32, false}, Case{1, 100, 33, 32, true}, Case{3, 200, 17, 64, true},
                         Case{1, 20, 5, 32, false}, Case{8, 515, 19, 128, false}, Case{2, 4096, 64, 32, true},
                         Case{12, 160, 9, 32, false}}) {
      SCOPED_TRACE("m " + std::to_string(c.m) + " k " + std::to_string(c.k) + " n " + std::to_string(c.n) +
                   " block " + std::to_string(c.block));
      Built built = blocked_matmul(c, rng);
      built.g.metadata["slimquant.int4_activations"] = "int8";
      ir::Graph fused_graph = built.g;
      runtime::apply_execution_fusions(fused_graph, {});
      ASSERT_EQ(fused_graph.nodes.size(), 1u);
      EXPECT_EQ(fused_graph.nodes[0].attr_int("int8_activations", 0), 1);
      const Tensor a = test::random_tensor({c.m, c.k}, rng);
      runtime::Session session(built.g);
      const Tensor got = session.run({{"a", a}}).begin()->second;
      const std::vector<double> exact = reference(c, built, a);
      const std::vector<double> want = c.m <= 8 ? reference_int8_activations(c, built, a) : exact;
      double magnitude = 0;
      for (double v : exact) magnitude = std::max(magnitude, std::abs(v));
      const double bound = 4e-6 * std::sqrt(static_cast<double>(c.k)) * (magnitude + 1.0);
      double worst_rounding = 0;
      for (int64_t i = 0; i < got.numel(); ++i) {
        EXPECT_NEAR(got.data<float>()[i], want[static_cast<size_t>(i)], bound) << i;
        const size_t at = static_cast<size_t>(i);
        worst_rounding = std::max(worst_rounding, std::abs(want[at] - exact[at]));
      }
      // int8 rounding of A moves each product by at most half a step of its group's scale.
      EXPECT_LT(worst_rounding, 0.02 * (magnitude + 1.0));
      if (c.m <= 8 && c.k >= 64) {
        EXPECT_GT(worst_rounding, bound) << "the int8 path must differ from the exact one";
      }
    }
  }
  unsetenv("SLIMQUANT_QB4W_ISA");
}

TEST(MatMulQb4w, BlockedDequantizeLinearNeedsMatchingScales) {
  std::mt19937 rng(3);
  Built built = blocked_matmul(Case{1, 64, 8, 32, false}, rng);
  // A scale tensor with the wrong block count is refused by the DequantizeLinear, naming the rule.
  const std::string scales = built.g.nodes[0].inputs[1];
  built.g.initializers[scales] = test::random_tensor({3, 8}, rng, 0.01f, 0.1f);
  runtime::SessionOptions plain;
  plain.fuse_activations = false;
  try {
    runtime::Session s(built.g, plain);
    s.run({{"a", test::random_tensor({1, 64}, rng)}});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("block_size"), std::string::npos) << e.what();
  }
}

}  // namespace
