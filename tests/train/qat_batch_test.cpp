// QAT on models that take fewer samples than a training batch: an input declaring batch 1, and a
// batch of 1 baked into a Reshape behind a dynamic declared batch (as exporters write it). Each step
// runs in parts with the gradients accumulated, equals the whole-batch step of the same model with
// a dynamic batch, and says once that it splits.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>

#include "slimquant/data/batch.h"
#include "slimquant/train/qat.h"
#include "gradcheck_util.h"  // OneThread, random_tensor, GraphBuilder

using namespace slimquant;

namespace qat_batch_test {

constexpr int64_t kSide = 6, kChannels = 4, kClasses = 3;

// x [N, 1, 6, 6] -> Conv 3x3 (4 channels, pad 1) -> Relu -> Reshape [N, 144] -> Gemm (144 -> 3).
// `declared`: the input's declared batch (-1: dynamic). `baked`: the Reshape's target is [1, 144]
// instead of [-1, 144]. The weights do not depend on either.
ir::Graph tiny_cnn(int64_t declared, bool baked) {
  std::mt19937 rng(7);
  test::GraphBuilder b;
  b.g.opset = 13;
  b.g.inputs.push_back({"x", DType::kFloat32,
                        std::vector<ir::Dim>{{declared, declared < 0 ? "batch" : ""}, {1, ""}, {kSide, ""}, {kSide, ""}}});
  const std::string w = b.constant(test::random_tensor({kChannels, 1, 3, 3}, rng, -0.5f, 0.5f));
  const std::string bias = b.constant(test::random_tensor({kChannels}, rng, -0.1f, 0.1f));
  const std::string conv = b.node("Conv", {"x", w, bias},
                                  {{"kernel_shape", std::vector<int64_t>{3, 3}}, {"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  const std::string relu = b.node("Relu", {conv});
  const int64_t features = kChannels * kSide * kSide;
  const std::string target = b.constant(Tensor::from_vector<int64_t>({2}, {baked ? 1 : -1, features}));
  const std::string flat = b.node("Reshape", {relu, target});
  const std::string fc_w = b.constant(test::random_tensor({kClasses, features}, rng, -0.1f, 0.1f));
  const std::string fc_b = b.constant(test::random_tensor({kClasses}, rng, -0.1f, 0.1f));
  const std::string logits = b.node("Gemm", {flat, fc_w, fc_b}, {{"transB", int64_t{1}}});
  b.g.outputs.push_back({logits, DType::kFloat32, std::nullopt});
  return b.g;
}

// Samples held in memory, with labels.
class Samples final : public data::Dataset {
 public:
  Samples(size_t n, uint32_t seed) : shape_{1, kSide, kSide} {
    std::mt19937 rng(seed);
    batch_ = test::random_tensor({static_cast<int64_t>(n), 1, kSide, kSide}, rng, -1.0f, 1.0f);
    for (size_t i = 0; i < n; ++i) labels_.push_back(static_cast<int64_t>(i % kClasses));
  }
  const std::string& name() const override { return name_; }
  size_t size() const override { return labels_.size(); }
  const Shape& sample_shape() const override { return shape_; }
  void load(size_t i, float* dst) const override {
    const int64_t numel = sample_numel();
    std::memcpy(dst, batch_.data<float>() + static_cast<int64_t>(i) * numel, static_cast<size_t>(numel) * sizeof(float));
  }
  bool has_labels() const override { return true; }
  int64_t label(size_t i) const override { return labels_.at(i); }
  data::Batch all() const {
    data::Batch b;
    b.inputs = batch_;
    b.labels = labels_;
    return b;
  }

 private:
  Shape shape_;
  Tensor batch_;
  std::vector<int64_t> labels_;
  std::string name_ = "memory";
};

struct FirstStep {
  std::map<std::string, Tensor> before, after;  // parameters by name
  double loss = 0.0;
  int64_t limit = 0;
  std::string said;  // stderr of the step
  Tensor simulated;
};

// prepare (abs_max calibration: ranges that do not depend on how the samples are grouped) and one
// SGD step on the whole data set as one batch.
FirstStep first_step(const ir::Graph& model, const Samples& data, const std::string& act_quanter) {
  quant::QuantRule rule;
  rule.activation = "abs_max";
  train::QATOptions o;
  o.batch_size = data.size();
  o.calib_batches = 1;
  o.act_quanter = act_quanter;
  train::QAT qat(quant::QuantConfig(rule), o);
  qat.prepare(model, &data);
  FirstStep r;
  for (train::Parameter* p : qat.graph().parameters()) r.before[p->name] = p->value.clone();
  testing::internal::CaptureStderr();
  r.loss = qat.train_step(data.all(), 0.05f);
  r.said = testing::internal::GetCapturedStderr();
  for (train::Parameter* p : qat.graph().parameters()) r.after[p->name] = p->value.clone();
  r.limit = qat.batch_limit();
  r.simulated = qat.simulate(data.all().inputs);
  return r;
}

// Whether each parameter after the step agrees within `rel` (relative), and the step moved some.
void expect_same_step(const FirstStep& whole, const FirstStep& parts, const std::string& what) {
  ASSERT_EQ(whole.after.size(), parts.after.size()) << what;
  float moved = 0.0f;
  for (const auto& [name, w] : whole.after) {
    ASSERT_TRUE(parts.after.count(name)) << what << ": " << name;
    const Tensor& p = parts.after.at(name);
    ASSERT_EQ(w.shape(), p.shape()) << what << ": " << name;
    const Tensor& w0 = whole.before.at(name);
    for (int64_t i = 0; i < w.numel(); ++i) {
      const float a = w.data<float>()[i], b = p.data<float>()[i];
      EXPECT_LE(std::fabs(a - b), 1e-5f * std::max(std::fabs(a), std::fabs(b)) + 1e-7f)
          << what << ": " << name << "[" << i << "] " << a << " (whole batch) vs " << b << " (in parts)";
      moved = std::max(moved, std::fabs(a - w0.data<float>()[i]));
    }
  }
  EXPECT_GT(moved, 1e-4f) << what << ": the step changed no parameter";
  EXPECT_NEAR(whole.loss, parts.loss, 1e-6 * std::fabs(whole.loss)) << what;
}

}  // namespace qat_batch_test

using namespace qat_batch_test;

TEST(QATBatch, StepInPartsEqualsTheWholeBatchStep) {
  test::OneThread one;
  const Samples data(4, 11);
  for (const std::string act : {"pact", "lsq_plus"}) {
    const FirstStep dynamic = first_step(tiny_cnn(-1, false), data, act);
    EXPECT_EQ(dynamic.limit, 0) << act;
    EXPECT_EQ(dynamic.said.find("accumulating the gradients"), std::string::npos) << dynamic.said;

    // The input declares batch 1: split before trying.
    const FirstStep declared = first_step(tiny_cnn(1, false), data, act);
    EXPECT_EQ(declared.limit, 1) << act;
    // The line is said once per process: by the first quanter's run, not again by the second's.
    const bool first_run = act == "pact";
    EXPECT_EQ(declared.said.find("the model takes at most 1 sample per run (its inputs declare batch 1): larger "
                                 "batches are run in parts of 1, each training step accumulating the gradients") !=
                  std::string::npos,
              first_run)
        << declared.said;
    expect_same_step(dynamic, declared, act + ", declared batch 1");

    // A dynamic declared batch, batch 1 baked into the Reshape: the whole batch fails, parts of one.
    const FirstStep baked = first_step(tiny_cnn(-1, true), data, act);
    EXPECT_EQ(baked.limit, 1) << act;
    EXPECT_EQ(baked.said.find("(it fails at batch 4: ") != std::string::npos, first_run) << baked.said;
    EXPECT_EQ(baked.said.find("accumulating the gradients of its parts") != std::string::npos, first_run) << baked.said;
    expect_same_step(dynamic, baked, act + ", baked batch 1");

    // Evaluation mode in parts, joined: the same logits.
    ASSERT_EQ(baked.simulated.shape(), (Shape{4, kClasses}));
    for (int64_t i = 0; i < baked.simulated.numel(); ++i)
      EXPECT_NEAR(baked.simulated.data<float>()[i], dynamic.simulated.data<float>()[i], 1e-4f) << act;
  }
}

// fit() with a --batch-size the model cannot take: the first batch (evaluation mode) finds the
// limit, the epochs run in parts, one line says so.
TEST(QATBatch, FitSplitsABatchTheModelCannotTake) {
  test::OneThread one;
  const Samples data(10, 5);  // 3 steps of 4, the last of 2
  train::QATOptions o;
  o.batch_size = 4;
  o.calib_batches = 1;
  train::QAT qat(quant::QuantConfig(), o);
  qat.prepare(tiny_cnn(-1, true), &data);
  std::vector<train::EpochReport> reports;
  testing::internal::CaptureStderr();
  EXPECT_NO_THROW(qat.fit(data, [&](const train::EpochReport& r) { reports.push_back(r); }));
  const std::string said = testing::internal::GetCapturedStderr();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].steps, 3u);
  EXPECT_EQ(reports[0].samples, 10u);
  EXPECT_TRUE(std::isfinite(reports[0].mean_loss));
  EXPECT_EQ(qat.batch_limit(), 1);
  size_t lines = 0;
  for (size_t at = said.find("accumulating the gradients"); at != std::string::npos;
       at = said.find("accumulating the gradients", at + 1))
    ++lines;
  EXPECT_EQ(lines, 1u) << said;
  EXPECT_NO_THROW(qat.convert());
}
