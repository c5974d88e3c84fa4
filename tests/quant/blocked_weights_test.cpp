// 4-bit blocked weights: round to nearest, GPTQ against a plain reference of the same algorithm,
// and the weight-only 4-bit export (INT4 behind an opset-21 blocked DequantizeLinear).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <random>

#include "quant/int8_test_util.h"
#include "slimquant/core/npy.h"
#include "test_util.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/blocked_weights.h"
#include "slimquant/quant/post_training_quantization.h"
#include "slimquant/runtime/session.h"

using namespace slimquant;

namespace {

using Matrix = std::vector<std::vector<double>>;  // [row][column]

Tensor random_matrix(int64_t rows, int64_t cols, std::mt19937& rng) {
  Tensor t(DType::kFloat32, {rows, cols});
  std::normal_distribution<float> d(0.f, 1.f);
  for (auto& v : t.values<float>()) v = d(rng);
  return t;
}

// The inverse of a symmetric positive definite matrix by Gauss-Jordan elimination (a direct solve of
// A X = I), written independently of the Cholesky route the implementation takes.
Matrix inverse(Matrix a) {
  const size_t n = a.size();
  Matrix x(n, std::vector<double>(n, 0.0));
  for (size_t i = 0; i < n; ++i) x[i][i] = 1;
  for (size_t c = 0; c < n; ++c) {
    size_t pivot = c;
    for (size_t r = c + 1; r < n; ++r)
      if (std::abs(a[r][c]) > std::abs(a[pivot][c])) pivot = r;
    std::swap(a[c], a[pivot]);
    std::swap(x[c], x[pivot]);
    const double p = a[c][c];
    for (size_t j = 0; j < n; ++j) a[c][j] /= p, x[c][j] /= p;
    for (size_t r = 0; r < n; ++r) {
      if (r == c) continue;
      const double f = a[r][c];
      for (size_t j = 0; j < n; ++j) a[r][j] -= f * a[c][j], x[r][j] -= f * x[c][j];
    }
  }
  return x;
}

// GPTQ as the paper derives it, one column at a time (Optimal Brain Surgeon updates): for column j
// of the remaining set F = {j, ..., K-1}, H_F^-1 is the inverse of H restricted to F (solved
// directly each time); q = round(w_j) on its block's scale (taken when the block's first column is
// reached, from the updated weights); w_F -= (w_j - q) / [H_F^-1]_jj * [H_F^-1]_{j, F}. w is
// [N][K] (rows = output features), H = 2 X^T X + damp * mean diag * I.
void reference_gptq(Matrix w, const Matrix& x, int64_t block, std::vector<std::vector<int>>& codes,
                    std::vector<std::vector<float>>& scales) {
  const size_t n = w.size(), k = w[0].size();
  Matrix h(k, std::vector<double>(k, 0.0));
  for (const auto& row : x)
    for (size_t a = 0; a < k; ++a)
      for (size_t b = 0; b < k; ++b) h[a][b] += 2.0 * row[a] * row[b];
  double mean = 0;
  for (size_t a = 0; a < k; ++a) mean += h[a][a] / static_cast<double>(k);
  for (size_t a = 0; a < k; ++a) h[a][a] += 0.01 * mean;
  const size_t kb = (k + static_cast<size_t>(block) - 1) / static_cast<size_t>(block);
  codes.assign(n, std::vector<int>(k, 0));
  scales.assign(n, std::vector<float>(kb, 0.f));
  for (size_t j = 0; j < k; ++j) {
    Matrix hf(k - j, std::vector<double>(k - j));
    for (size_t a = j; a < k; ++a)
      for (size_t b = j; b < k; ++b) hf[a - j][b - j] = h[a][b];
    const Matrix inv = inverse(hf);
    for (size_t r = 0; r < n; ++r) {
      if (j % static_cast<size_t>(block) == 0) {
        double m = 0;
        for (size_t t = j; t < std::min(k, j + static_cast<size_t>(block)); ++t) m = std::max(m, std::abs(w[r][t]));
        scales[r][j / static_cast<size_t>(block)] = m > 0 ? static_cast<float>(m / 7) : 1.f;
      }
      const float s = scales[r][j / static_cast<size_t>(block)];
      const int q = static_cast<int>(std::clamp(std::nearbyint(w[r][j] / s), -8.0, 7.0));
      codes[r][j] = q;
      const double e = (w[r][j] - q * static_cast<double>(s)) / inv[0][0];
      for (size_t t = j; t < k; ++t) w[r][t] -= e * inv[0][t - j];
    }
  }
}

// ||X W - X W_q||_F^2 with W [K][N] as stored for a MatMul.
double output_error(const Tensor& x, const Tensor& w, const Tensor& wq) {
  const int64_t rows = x.dim(0), k = x.dim(1), n = w.dim(1);
  double err = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      double d = 0;
      for (int64_t t = 0; t < k; ++t)
        d += x.data<float>()[r * k + t] * (static_cast<double>(w.data<float>()[t * n + j]) - wq.data<float>()[t * n + j]);
      err += d * d;
    }
  return err;
}

TEST(BlockedWeights, RoundToNearestPerBlockAlongTheReductionAxis) {
  std::mt19937 rng(1);
  // K = 40 with blocks of 32: a full block and a short one (8 values).
  const Tensor w = random_matrix(40, 6, rng);
  const quant::BlockedWeights q = quant::quantize_blocked_rtn(w, 0, 32);
  ASSERT_EQ(q.codes.shape(), (Shape{40, 6}));
  ASSERT_EQ(q.scales.shape(), (Shape{2, 6}));
  for (int64_t j = 0; j < 6; ++j)
    for (int64_t b = 0; b < 2; ++b) {
      float m = 0;
      for (int64_t k = b * 32; k < std::min<int64_t>(40, (b + 1) * 32); ++k) m = std::max(m, std::abs(w.data<float>()[k * 6 + j]));
      EXPECT_FLOAT_EQ(q.scales.data<float>()[b * 6 + j], m / 7);
    }
  const Tensor back = quant::dequantize_blocked_weights(q, 0, 32);
  for (int64_t i = 0; i < w.numel(); ++i) {
    const int c = q.codes.data<int8_t>()[i];
    EXPECT_GE(c, -7);
    EXPECT_LE(c, 7);
    const float s = q.scales.data<float>()[(i / 6 / 32) * 6 + i % 6];
    EXPECT_LE(std::abs(back.data<float>()[i] - w.data<float>()[i]), 0.5f * s + 1e-6f) << i;
  }
  // The transposed layout (Gemm transB: [N, K], axis 1) gives the same codes, transposed.
  Tensor wt(DType::kFloat32, {6, 40});
  for (int64_t k = 0; k < 40; ++k)
    for (int64_t j = 0; j < 6; ++j) wt.data<float>()[j * 40 + k] = w.data<float>()[k * 6 + j];
  const quant::BlockedWeights qt = quant::quantize_blocked_rtn(wt, 1, 32);
  ASSERT_EQ(qt.scales.shape(), (Shape{6, 2}));
  for (int64_t k = 0; k < 40; ++k)
    for (int64_t j = 0; j < 6; ++j) EXPECT_EQ(qt.codes.data<int8_t>()[j * 40 + k], q.codes.data<int8_t>()[k * 6 + j]);
}

TEST(BlockedWeights, GptqEqualsThePlainReferenceAndBeatsRoundToNearest) {
  std::mt19937 rng(11);
  const int64_t k = 16, n = 8, rows = 64, block = 8;
  const Tensor w = random_matrix(k, n, rng);  // MatMul B [K, N]
  // Correlated inputs (x = z M), as layer inputs are: where GPTQ's error feedback has something to use.
  const Tensor z = random_matrix(rows, k, rng), mix = random_matrix(k, k, rng);
  Tensor x(DType::kFloat32, {rows, k});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < k; ++c) {
      double v = 0;
      for (int64_t t = 0; t < k; ++t) v += z.data<float>()[r * k + t] * mix.data<float>()[t * k + c];
      x.data<float>()[r * k + c] = static_cast<float>(v);
    }
  std::vector<double> gram(static_cast<size_t>(k * k), 0.0);
  quant::accumulate_gram(x.data<float>(), rows, k, gram);
  quant::GptqOptions options;
  options.column_block = 8;  // two column blocks: the lazy update between them is exercised
  const quant::BlockedWeights gptq = quant::quantize_blocked_gptq(w, 0, block, gram, options);

  Matrix wr(n, std::vector<double>(k)), xr(rows, std::vector<double>(k));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t t = 0; t < k; ++t) wr[j][t] = w.data<float>()[t * n + j];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < k; ++t) xr[r][t] = x.data<float>()[r * k + t];
  std::vector<std::vector<int>> codes;
  std::vector<std::vector<float>> scales;
  reference_gptq(wr, xr, block, codes, scales);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t t = 0; t < k; ++t)
      EXPECT_EQ(gptq.codes.data<int8_t>()[t * n + j], codes[j][t]) << "row " << j << " column " << t;
    for (int64_t b = 0; b < k / block; ++b)
      EXPECT_NEAR(gptq.scales.data<float>()[b * n + j], scales[j][b], 1e-6f * scales[j][b]) << j << ", " << b;
  }
  // The same column block as the whole width gives the same result (the lazy update is exact).
  options.column_block = 128;
  const quant::BlockedWeights wide = quant::quantize_blocked_gptq(w, 0, block, gram, options);
  for (int64_t i = 0; i < w.numel(); ++i) EXPECT_EQ(wide.codes.data<int8_t>()[i], gptq.codes.data<int8_t>()[i]) << i;

  const quant::BlockedWeights rtn = quant::quantize_blocked_rtn(w, 0, block);
  const double e_gptq = output_error(x, w, quant::dequantize_blocked_weights(gptq, 0, block));
  const double e_rtn = output_error(x, w, quant::dequantize_blocked_weights(rtn, 0, block));
  EXPECT_LT(e_gptq, e_rtn) << "GPTQ's output error " << e_gptq << " vs RTN's " << e_rtn;
}

TEST(BlockedWeights, WeightOnlyFourBitsWritesInt4BlocksAtOpset21) {
  quant::PostTrainingQuantizationOptions o;
  o.model_dir = test::fixture_model("vit_small");
  o.mode = "weight-only";
  o.weight_bits = 4;
  o.block_size = 32;
  quant::PostTrainingQuantization ptq(o);
  const ir::Graph g = ptq.quantize();
  EXPECT_EQ(g.opset, 21);
  EXPECT_EQ(g.metadata.at("slimquant.block_size"), "32");
  size_t blocked = 0;
  for (const auto& n : g.nodes) {
    if (n.op_type != "DequantizeLinear") continue;
    if (!n.attrs.count("block_size")) {
      EXPECT_EQ(g.initializer(n.inputs[1])->rank(), 1u) << "the Conv stays 8-bit per channel: " << n.name;
      continue;
    }
    ++blocked;
    EXPECT_EQ(n.attr_int("block_size", 0), 32);
    EXPECT_EQ(g.stored_4bit_types.at(n.inputs[0]), 22);
  }
  EXPECT_EQ(blocked, 13u) << "12 MatMul weights and the Gemm head";
  // Saved and loaded again: the INT4 codes come back unpacked, and the model runs close to FP32.
  test::TempDir tmp("blocked_weights");
  ir::save_onnx(g, tmp.path("w4.onnx"));
  const ir::Graph loaded = ir::load_onnx(tmp.path("w4.onnx"));
  EXPECT_EQ(loaded.stored_4bit_types.size(), blocked);
  for (const auto& [name, type] : loaded.stored_4bit_types) {
    const Tensor& t = loaded.initializers.at(name);
    const Tensor& before = g.initializers.at(name);
    ASSERT_EQ(t.shape(), before.shape());
    for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(t.data<int8_t>()[i], before.data<int8_t>()[i]) << name << " " << i;
  }
  const Tensor input = read_npy(test::source_path("tests/fixtures/models/vit_small.input.npy"));
  runtime::Session fp32(ir::load_onnx(o.model_dir)), w4(loaded);
  const Tensor a = fp32.run({{"input", input}}).at("logits"), b = w4.run({{"input", input}}).at("logits");
  double signal = 0, noise = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    signal += double(a.data<float>()[i]) * a.data<float>()[i];
    noise += (double(a.data<float>()[i]) - b.data<float>()[i]) * (double(a.data<float>()[i]) - b.data<float>()[i]);
  }
  EXPECT_GT(10 * std::log10(signal / noise), 15.0) << "4-bit weights, blocks of 32";
}

TEST(BlockedWeights, BadSettingsAreRefusedNamingThem) {
  quant::QuantConfig c;
  c.block_size = 48;
  c.mode = quant::QuantMode::kWeightOnly;
  c.weight_bits = 4;
  EXPECT_THROW(c.validate(), Error);
  c.block_size = 64;
  EXPECT_NO_THROW(c.validate());
  c.mode = quant::QuantMode::kStatic;
  try {
    c.validate();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weight-only"), std::string::npos) << e.what();
  }
  c.block_size = 0;
  c.weight_rounding = quant::WeightRounding::kGptq;
  EXPECT_THROW(c.validate(), Error);
  EXPECT_THROW(quant::parse_weight_rounding("awq"), Error);

  // int4_activations int8: 4-bit weight-only only; in YAML; part of the fingerprint.
  c.weight_rounding = quant::WeightRounding::kRtn;
  c.mode = quant::QuantMode::kWeightOnly;
  c.int4_activations = quant::Int4Activations::kInt8;
  EXPECT_NO_THROW(c.validate());
  EXPECT_NE(c.fingerprint().find("int4_activations:int8"), std::string::npos) << c.fingerprint();
  c.weight_bits = 8;
  EXPECT_THROW(c.validate(), Error);
  EXPECT_THROW(quant::parse_int4_activations("fp16"), Error);
  test::TempDir tmp("int4_activations_yaml");
  std::ofstream(tmp.path("c.yaml")) << "mode: weight-only\nweight_bits: 4\nint4_activations: int8\n";
  EXPECT_EQ(quant::load_quant_config_yaml(tmp.path("c.yaml")).int4_activations, quant::Int4Activations::kInt8);
}

}  // namespace
