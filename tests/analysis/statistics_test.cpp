#include "slimquant/analysis/statistics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "slimquant/core/error.h"
#include "slimquant/data/batch.h"
#include "slimquant/ir/onnx_io.h"
#include "test_util.h"

using namespace slimquant;
using nlohmann::json;

namespace {

// Samples held in memory, shape {features}.
class VectorDataset final : public data::Dataset {
 public:
  VectorDataset(std::vector<std::vector<float>> rows) : rows_(std::move(rows)), shape_{static_cast<int64_t>(rows_.at(0).size())} {}
  const std::string& name() const override { return name_; }
  size_t size() const override { return rows_.size(); }
  const Shape& sample_shape() const override { return shape_; }
  void load(size_t i, float* dst) const override { std::memcpy(dst, rows_.at(i).data(), rows_[i].size() * sizeof(float)); }
  bool has_labels() const override { return false; }
  int64_t label(size_t) const override { fail(ErrorKind::kInvalidArgument, "no labels"); }

 private:
  std::vector<std::vector<float>> rows_;
  Shape shape_;
  std::string name_ = "memory";
};

using Matrix = std::vector<std::vector<double>>;  // [rows][cols]

Matrix matmul(const Matrix& a, const Matrix& b) {
  Matrix c(a.size(), std::vector<double>(b[0].size(), 0.0));
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t k = 0; k < b.size(); ++k)
      for (size_t j = 0; j < b[0].size(); ++j) c[i][j] += a[i][k] * b[k][j];
  return c;
}

// QuantizeLinear then DequantizeLinear as ONNX defines them (float division, ties to even).
double fake_quant(double v, float scale, float qmin, float qmax) {
  const float q = std::clamp(std::nearbyint(static_cast<float>(v) / scale), qmin, qmax);
  return static_cast<double>(q * scale);
}

Matrix fake_quant_act(const Matrix& m, float scale) {
  Matrix out = m;
  for (auto& row : out)
    for (auto& v : row) v = fake_quant(v, scale, -128.f, 127.f);
  return out;
}

// Per output column (MatMul weight [K, N]): s_c = max_k |w[k][c]| / 127, q in [-127, 127].
Matrix fake_quant_weight(const Matrix& w) {
  Matrix out = w;
  for (size_t c = 0; c < w[0].size(); ++c) {
    double m = 0;
    for (const auto& row : w) m = std::max(m, std::abs(row[c]));
    const float s = static_cast<float>(m) / 127.f;
    for (auto& row : out) row[c] = fake_quant(row[c], s, -127.f, 127.f);
  }
  return out;
}

double sqnr_db(const Matrix& x, const Matrix& xq) {
  double s = 0, n = 0;
  for (size_t i = 0; i < x.size(); ++i)
    for (size_t j = 0; j < x[i].size(); ++j) s += x[i][j] * x[i][j], n += (x[i][j] - xq[i][j]) * (x[i][j] - xq[i][j]);
  return 10 * std::log10(s / n);
}

struct Stats {
  double min, max, mean, std;
};
Stats stats(const Matrix& m) {
  std::vector<double> v;
  for (const auto& r : m) v.insert(v.end(), r.begin(), r.end());
  Stats s{*std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end()), 0, 0};
  for (double x : v) s.mean += x / static_cast<double>(v.size());
  for (double x : v) s.std += (x - s.mean) * (x - s.mean) / static_cast<double>(v.size());
  s.std = std::sqrt(s.std);
  return s;
}

void expect_stats(const json& j, const Stats& s, double tol, const std::string& what) {
  ASSERT_TRUE(j.is_object()) << what;
  EXPECT_NEAR(j["min"].get<double>(), s.min, tol) << what;
  EXPECT_NEAR(j["max"].get<double>(), s.max, tol) << what;
  EXPECT_NEAR(j["mean"].get<double>(), s.mean, tol) << what;
  EXPECT_NEAR(j["std"].get<double>(), s.std, tol) << what;
}

Tensor to_tensor(const Matrix& m) {
  std::vector<float> v;
  for (const auto& r : m)
    for (double x : r) v.push_back(static_cast<float>(x));
  return Tensor::from_vector<float>({static_cast<int64_t>(m.size()), static_cast<int64_t>(m[0].size())}, v);
}

// x [N,4] -> MatMul W1 [4,3] -> h -> MatMul W2 [3,2] -> y, no activation in between, so every
// quantity has a closed form in a few loops.
TEST(LayerStatistics, TwoMatMulsMatchDirectComputation) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  Matrix w1(4, std::vector<double>(3)), w2(3, std::vector<double>(2));
  for (auto& r : w1)
    for (auto& v : r) v = static_cast<float>(u(rng));
  for (auto& r : w2)
    for (auto& v : r) v = static_cast<float>(u(rng) * 0.5f);
  std::vector<std::vector<float>> rows(37, std::vector<float>(4));
  Matrix x(37, std::vector<double>(4));
  for (size_t i = 0; i < rows.size(); ++i)
    for (size_t j = 0; j < 4; ++j) x[i][j] = rows[i][j] = u(rng) * static_cast<float>(j + 1);

  ir::Graph g;
  g.name = "two_matmuls";
  g.opset = 13;
  g.inputs = {{"x", DType::kFloat32, std::vector<ir::Dim>{{-1, "N"}, {4, ""}}}};
  g.outputs = {{"y", DType::kFloat32, std::vector<ir::Dim>{{-1, "N"}, {2, ""}}}};
  g.initializers["W1"] = to_tensor(w1);
  g.initializers["W2"] = to_tensor(w2);
  ir::Node mm1, mm2;
  mm1.op_type = mm2.op_type = "MatMul";
  mm1.name = "mm1";
  mm1.inputs = {"x", "W1"};
  mm1.outputs = {"h"};
  mm2.name = "mm2";
  mm2.inputs = {"h", "W2"};
  mm2.outputs = {"y"};
  g.nodes = {mm1, mm2};

  quant::QuantConfig config(quant::QuantRule{"abs_max", "channel_wise_abs_max", true});
  config.weight_bits = 8;  // the closed forms below use 127 levels
  quant::PTQ ptq(config);
  ptq.quantize(g);
  ASSERT_EQ(ptq.layers().size(), 2u);
  VectorDataset ds(rows);
  for (const auto& b : data::BatchLoader(ds, 8)) ptq.sample(b.inputs);

  test::TempDir tmp("stats_tiny");
  analysis::StatisticsOptions opt;
  opt.batch_size = 8;  // 5 batches, the last one short: sums must run over all of them
  const json j = analysis::run_layer_statistics(ptq, ds, tmp.path("out"), opt);
  EXPECT_EQ(j["samples"].get<size_t>(), 37u);
  ASSERT_EQ(j["layers"].size(), 2u);
  const json& l1 = j["layers"][0];
  const json& l2 = j["layers"][1];
  EXPECT_EQ(l1["layer"], "mm1");
  EXPECT_EQ(l2["activations"], json::array({"h"}));

  // Reference computation.
  const Matrix h = matmul(x, w1), y = matmul(h, w2);
  const float sx = ptq.activation_params("x").scale.at(0), sh = ptq.activation_params("h").scale.at(0);
  EXPECT_NEAR(sx, std::max(-stats(x).min, stats(x).max) / 127, 1e-7);  // abs_max, symmetric
  EXPECT_NEAR(sh, std::max(-stats(h).min, stats(h).max) / 127, 1e-6);
  const Matrix xq = fake_quant_act(x, sx), hq_in = fake_quant_act(h, sh);
  const Matrix w1q = fake_quant_weight(w1), w2q = fake_quant_weight(w2);
  const Matrix h_iso = matmul(xq, w1q);           // only mm1 quantized
  const Matrix y_iso = matmul(hq_in, w2q);        // only mm2 quantized, fed FP32 h
  const Matrix y_acc = matmul(fake_quant_act(h_iso, sh), w2q);  // both quantized

  expect_stats(l1["weight_fp32"], stats(w1), 1e-7, "w1 fp32");
  expect_stats(l1["weight_quant"], stats(w1q), 1e-7, "w1 quant");
  expect_stats(l2["weight_quant"], stats(w2q), 1e-7, "w2 quant");
  EXPECT_NEAR(l1["weight_sqnr_db"].get<double>(), sqnr_db(w1, w1q), 1e-4);
  expect_stats(l1["act_fp32"], stats(x), 1e-6, "x fp32");
  expect_stats(l1["act_quant"], stats(xq), 1e-6, "x quant");
  expect_stats(l2["act_fp32"], stats(h), 1e-5, "h fp32");
  expect_stats(l2["act_quant"], stats(hq_in), 1e-5, "h quant");
  EXPECT_NEAR(l1["act_sqnr_db"].get<double>(), sqnr_db(x, xq), 1e-3);
  EXPECT_NEAR(l2["act_sqnr_db"].get<double>(), sqnr_db(h, hq_in), 1e-2);

  EXPECT_NEAR(l1["output_sqnr_isolated_db"].get<double>(), sqnr_db(h, h_iso), 1e-2);
  EXPECT_NEAR(l2["output_sqnr_isolated_db"].get<double>(), sqnr_db(y, y_iso), 1e-2);
  EXPECT_NEAR(l2["output_sqnr_accumulated_db"].get<double>(), sqnr_db(y, y_acc), 1e-2);
  // The first layer reads the model input: isolated and accumulated are the same computation.
  EXPECT_NEAR(l1["output_sqnr_accumulated_db"].get<double>(), l1["output_sqnr_isolated_db"].get<double>(), 1e-9);
  // And the two differ for the second layer (the test would not tell them apart otherwise).
  EXPECT_GT(std::abs(sqnr_db(y, y_iso) - sqnr_db(y, y_acc)), 0.1);

  // Files: the same JSON with the measured times apart, and a CSV with a header and one row per layer.
  json results = j;
  results.erase("wall_seconds");
  results.erase("setup_seconds");
  std::ifstream jf(tmp.path("out/statistics.json"));
  EXPECT_EQ(json::parse(jf), results);
  std::ifstream tf(tmp.path("out/statistics_timing.json"));
  const json timing = json::parse(tf);
  EXPECT_EQ(timing.at("wall_seconds"), j.at("wall_seconds"));
  EXPECT_EQ(timing.at("setup_seconds"), j.at("setup_seconds"));
  std::ifstream cf(tmp.path("out/statistics.csv"));
  std::vector<std::string> lines;
  for (std::string line; std::getline(cf, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].rfind("index,layer,op_type,weight,activations,", 0), 0u);
  EXPECT_EQ(lines[2].rfind("1,mm2,MatMul,W2,h,", 0), 0u) << lines[2];
  const std::string iso2 = lines[2].substr(lines[2].rfind(',', lines[2].rfind(',') - 1) + 1);
  EXPECT_NEAR(std::stod(iso2.substr(0, iso2.find(','))), sqnr_db(y, y_iso), 1e-2);

  // max_batches bounds the data pass.
  opt.max_batches = 2;
  EXPECT_EQ(analysis::run_layer_statistics(ptq, ds, tmp.path("out2"), opt)["samples"].get<size_t>(), 16u);
}

// Values on the quantization grid: x = k/128 with max |x| = 127/128, so abs_max gives a scale of
// exactly 2^-7 and quantization loses nothing; the same for the weight column. Infinite SQNR is
// "inf" in the CSV and null in the JSON.
TEST(LayerStatistics, LosslessQuantizationIsInfiniteSqnr) {
  ir::Graph g;
  g.opset = 13;
  g.inputs = {{"x", DType::kFloat32, std::vector<ir::Dim>{{-1, "N"}, {2, ""}}}};
  g.outputs = {{"y", DType::kFloat32, std::vector<ir::Dim>{{-1, "N"}, {1, ""}}}};
  g.initializers["W"] = Tensor::from_vector<float>({2, 1}, {127.f / 128, -64.f / 128});
  ir::Node mm;
  mm.op_type = "MatMul";
  mm.name = "mm";
  mm.inputs = {"x", "W"};
  mm.outputs = {"y"};
  g.nodes = {mm};
  std::vector<std::vector<float>> rows;
  for (int k = -127; k <= 127; k += 9) rows.push_back({k / 128.f, static_cast<float>((127 - k) / 2) / 128});
  rows.push_back({127.f / 128, 0.f});
  quant::QuantConfig config(quant::QuantRule{"abs_max", "channel_wise_abs_max", true});
  config.weight_bits = 8;  // the closed forms below use 127 levels
  quant::PTQ ptq(config);
  ptq.quantize(g);
  VectorDataset ds(rows);
  for (const auto& b : data::BatchLoader(ds, 16)) ptq.sample(b.inputs);
  ASSERT_EQ(ptq.activation_params("x").scale.at(0), 1.f / 128);

  test::TempDir tmp("stats_exact");
  const json j = analysis::run_layer_statistics(ptq, ds, tmp.path());
  const json& row = j["layers"][0];
  for (const char* k : {"weight_sqnr_db", "act_sqnr_db", "output_sqnr_isolated_db", "output_sqnr_accumulated_db"})
    EXPECT_TRUE(row[k].is_null()) << k << " " << row[k];
  EXPECT_EQ(row["act_quant"]["std"], row["act_fp32"]["std"]);
  std::ifstream cf(tmp.path("statistics.csv"));
  std::string header, line;
  std::getline(cf, header);
  std::getline(cf, line);
  EXPECT_EQ(line.substr(line.size() - 8), ",inf,inf") << line;
}

TEST(LayerStatistics, NoQuantizableLayerGivesHeaderOnlyReports) {
  ir::Graph g;
  g.opset = 13;
  g.inputs = {{"x", DType::kFloat32, std::vector<ir::Dim>{{-1, "N"}, {2, ""}}}};
  g.outputs = {{"y", DType::kFloat32, std::vector<ir::Dim>{{-1, "N"}, {2, ""}}}};
  ir::Node relu;
  relu.op_type = "Relu";
  relu.name = "relu";
  relu.inputs = {"x"};
  relu.outputs = {"y"};
  g.nodes = {relu};
  quant::PTQ ptq(quant::QuantConfig{});
  ptq.quantize(g);
  ASSERT_TRUE(ptq.layers().empty());
  VectorDataset ds({{1.f, -1.f}, {0.5f, 2.f}});
  test::TempDir tmp("stats_none");
  const json j = analysis::run_layer_statistics(ptq, ds, tmp.path());
  EXPECT_TRUE(j["layers"].empty());
  EXPECT_EQ(j["samples"].get<size_t>(), 0u);
  std::ifstream cf(tmp.path("statistics.csv"));
  size_t lines = 0;
  for (std::string line; std::getline(cf, line);) ++lines;
  EXPECT_EQ(lines, 1u);
}

TEST(LayerStatistics, ErrorsNameTheProblem) {
  quant::PTQ ptq(quant::QuantConfig{});
  ptq.quantize(ir::load_onnx(test::fixture_model("resnet_small")));
  data::DataOptions o;
  o.limit = 8;
  auto ds = data::open_dataset(o);
  test::TempDir tmp("stats_err");
  try {  // not calibrated
    analysis::run_layer_statistics(ptq, *ds, tmp.path("a"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidData) << e.what();
  }
  ptq.sample(data::BatchLoader(*ds, 8).batch(0).inputs);
  std::ofstream(tmp.path("file")) << "x";
  try {  // save_dir under a regular file
    analysis::run_layer_statistics(ptq, *ds, tmp.path("file/sub"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo) << e.what();
  }
}

TEST(LayerStatistics, ResnetSmallRowsPerLayerAndErrorAccumulates) {
  quant::PTQ ptq(quant::QuantConfig{});
  ptq.quantize(ir::load_onnx(test::fixture_model("resnet_small")));
  data::DataOptions o;
  o.spec = "fashion-mnist:test";
  o.limit = 256;
  auto ds = data::open_dataset(o);
  data::BatchLoader loader(*ds, 64);
  for (const auto& b : loader) ptq.sample(b.inputs);

  test::TempDir tmp("stats_resnet");
  const json j = analysis::run_layer_statistics(ptq, *ds, tmp.path());
  const auto& rows = j["layers"];
  ASSERT_EQ(rows.size(), ptq.layers().size());
  ASSERT_GT(rows.size(), 5u);
  for (const auto& r : rows) {
    for (const char* k : {"weight_sqnr_db", "output_sqnr_isolated_db", "output_sqnr_accumulated_db"})
      EXPECT_TRUE(r[k].is_number()) << r["layer"] << " " << k;  // finite (non-finite is null)
    // null = +inf: pixels k/255 under a 1/255 scale quantize without error.
    EXPECT_TRUE(r["act_sqnr_db"].is_number() || r["act_sqnr_db"].is_null()) << r["layer"];
    for (const char* k : {"weight_fp32", "weight_quant", "act_fp32", "act_quant"})
      for (const char* m : {"min", "max", "mean", "std"}) EXPECT_TRUE(r[k][m].is_number()) << r["layer"] << k << m;
    // Fake quantization never leaves the clipping range of the data by more than a step.
    EXPECT_LE(r["act_quant"]["max"].get<double>(), r["act_fp32"]["max"].get<double>() * 1.05 + 1e-6) << r["layer"];
    EXPECT_GT(r["weight_sqnr_db"].get<double>(), 25.0) << r["layer"];  // 8-bit per-channel weights
  }
  // The first layer reads the image: its input statistics are the pixels', and nothing upstream
  // is quantized, so accumulated == isolated.
  double lo = 1, hi = 0;
  std::vector<float> px(static_cast<size_t>(ds->sample_numel()));
  for (size_t i = 0; i < ds->size(); ++i) {
    ds->load(i, px.data());
    for (float v : px) lo = std::min(lo, static_cast<double>(v)), hi = std::max(hi, static_cast<double>(v));
  }
  EXPECT_DOUBLE_EQ(rows[0]["act_fp32"]["min"].get<double>(), lo);
  EXPECT_DOUBLE_EQ(rows[0]["act_fp32"]["max"].get<double>(), hi);
  EXPECT_NEAR(rows[0]["output_sqnr_accumulated_db"].get<double>(), rows[0]["output_sqnr_isolated_db"].get<double>(), 1e-6);
  // Twenty-odd quantized layers upstream cost more than the last layer's own quantization.
  const auto& last = rows.back();
  EXPECT_LT(last["output_sqnr_accumulated_db"].get<double>(), last["output_sqnr_isolated_db"].get<double>());
  std::ifstream cf(tmp.path("statistics.csv"));
  size_t lines = 0;
  for (std::string line; std::getline(cf, line);) ++lines;
  EXPECT_EQ(lines, rows.size() + 1);
}

}  // namespace
