// The one calibration loop (quant::calibrate) over its three sources: batches counted, samples
// calibrated on, the first rows and the rows held back (after the calibrated ones, else the last
// batch, observed afterwards), warnings when a source holds less than batch_nums, and resumption
// from a checkpoint giving the uninterrupted model.
#include <gtest/gtest.h>

#include "slimquant/data/batch.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/calibration.h"
#include "slimquant/runtime/session.h"
#include "multi_input_model.h"
#include "test_util.h"

using namespace slimquant;

namespace {

class Calibration : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = ir::load_onnx(test::fixture_model("resnet_small"));
    data::DataOptions o;
    o.spec = "fashion-mnist:test";
    o.limit = 10;
    data_ = data::open_dataset(o);
    data::BatchLoader all(*data_, 10);
    images_ = all.batch(0).inputs;  // [10, 1, 28, 28]
  }
  std::unique_ptr<quant::PTQ> fresh_ptq() const {
    auto ptq = std::make_unique<quant::PTQ>(quant::QuantConfig{});
    ptq->quantize(model_);
    return ptq;
  }
  // Rows [first, first + count) of the images as a feed of the model's input.
  quant::Feeds rows(int64_t first, int64_t count) const {
    return runtime::feed_rows({{model_.inputs[0].name, images_}}, first, count);
  }
  // A batch generator over the images in batches of the given sizes.
  quant::BatchGenerator batches_of(std::vector<int64_t> sizes) const {
    return [this, sizes, i = size_t{0}, at = int64_t{0}]() mutable -> std::optional<quant::Feeds> {
      if (i == sizes.size()) return std::nullopt;
      quant::Feeds b = rows(at, sizes[i]);
      at += sizes[i++];
      return b;
    };
  }
  quant::SampleGenerator samples(int64_t count) const {
    return [this, count, i = int64_t{0}]() mutable -> std::optional<quant::Feeds> {
      if (i == count) return std::nullopt;
      return rows(i++, 1);
    };
  }
  static std::string model_bytes(const quant::PTQ& ptq) { return ir::serialize_onnx(ptq.convert()); }

  ir::Graph model_;
  std::unique_ptr<data::Dataset> data_;
  Tensor images_;
};

void expect_rows_equal(const quant::Feeds& got, const quant::Feeds& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_EQ(got.at(name).shape(), t.shape()) << name;
    EXPECT_EQ(got.at(name).to_float_vector(), t.to_float_vector()) << name;
  }
}

TEST_F(Calibration, DatasetBatchesHeldBackRowsAndTheSameModelAsSamplingByHand) {
  auto ptq = fresh_ptq();
  auto source = quant::dataset_calibration_source(*data_, 4, model_.inputs);
  quant::CalibrationLoopOptions o;
  o.batch_nums = 2;
  o.first_rows = 3;
  o.held_back_rows = [](size_t calibrated) { return calibrated / 2; };  // 8 calibrated: ask 4, 2 remain
  const quant::CalibrationRun run = quant::calibrate(*ptq, *source, o);
  EXPECT_EQ(run.batches, 2u);
  EXPECT_EQ(run.samples, 8u);
  EXPECT_EQ(run.calibrated_samples, 8u);
  EXPECT_TRUE(run.warnings.empty());
  expect_rows_equal(run.first_rows, rows(0, 3));
  expect_rows_equal(run.held_back, rows(8, 2));

  auto by_hand = fresh_ptq();
  by_hand->sample(rows(0, 4));
  by_hand->sample(rows(4, 4));
  EXPECT_EQ(model_bytes(*ptq), model_bytes(*by_hand));

  // Every batch (the last one short), nothing after them: the last batch is held back, observed by
  // finish_calibration; more asked than held: a warning.
  auto all = fresh_ptq();
  o.batch_nums = 5;
  quant::CalibrationRun whole = quant::calibrate(*all, *source, o);
  EXPECT_EQ(whole.batches, 2u);
  EXPECT_EQ(whole.calibrated_samples, 10u);
  ASSERT_TRUE(whole.deferred_batch.has_value());
  expect_rows_equal(*whole.deferred_batch, rows(8, 2));
  expect_rows_equal(whole.held_back, rows(8, 2));  // 5 asked, the batch holds 2
  ASSERT_EQ(whole.warnings.size(), 1u);
  EXPECT_NE(whole.warnings[0].find("holds only 3 batches (10 samples)"), std::string::npos) << whole.warnings[0];
  quant::finish_calibration(*all, whole);
  EXPECT_EQ(whole.batches, 3u);
  EXPECT_FALSE(whole.deferred_batch.has_value());
  auto every_batch = fresh_ptq();
  quant::calibrate(*every_batch, *source, {});
  EXPECT_EQ(model_bytes(*all), model_bytes(*every_batch));
}

TEST_F(Calibration, BatchGeneratorCountsItsOwnBatchSizes) {
  auto ptq = fresh_ptq();
  auto source = quant::batch_generator_calibration_source(batches_of({3, 2, 4}), model_.inputs);
  quant::CalibrationLoopOptions o;
  o.batch_nums = 2;
  o.first_rows = 16;
  o.held_back_rows = [](size_t) { return size_t{2}; };
  const quant::CalibrationRun run = quant::calibrate(*ptq, *source, o);
  EXPECT_EQ(run.batches, 2u);
  EXPECT_EQ(run.calibrated_samples, 5u);
  expect_rows_equal(run.first_rows, rows(0, 3));  // the first batch, whatever first_rows asks beyond it
  expect_rows_equal(run.held_back, rows(5, 2));   // the leading rows of the next batch

  // Read to its end before batch_nums: a warning, and its last batch held back until finished.
  auto short_ptq = fresh_ptq();
  auto short_source = quant::batch_generator_calibration_source(batches_of({3, 2}), model_.inputs);
  o.batch_nums = 4;
  quant::CalibrationRun ended = quant::calibrate(*short_ptq, *short_source, o);
  EXPECT_EQ(ended.batches, 1u);
  EXPECT_EQ(ended.calibrated_samples, 5u);
  expect_rows_equal(ended.held_back, rows(3, 2));
  ASSERT_EQ(ended.warnings.size(), 1u);
  EXPECT_NE(ended.warnings[0].find("ended after 2 batches"), std::string::npos) << ended.warnings[0];
  quant::finish_calibration(*short_ptq, ended);
  EXPECT_EQ(ended.batches, 2u);
  auto both = fresh_ptq();
  both->sample(rows(0, 3));
  both->sample(rows(3, 2));
  EXPECT_EQ(model_bytes(*short_ptq), model_bytes(*both));

  // A single batch: nothing to hold back.
  auto one_ptq = fresh_ptq();
  auto one_source = quant::batch_generator_calibration_source(batches_of({3}), model_.inputs);
  quant::CalibrationRun one = quant::calibrate(*one_ptq, *one_source, o);
  EXPECT_EQ(one.batches, 1u);
  EXPECT_TRUE(one.held_back.empty());
  EXPECT_FALSE(one.deferred_batch.has_value());

  auto none = quant::batch_generator_calibration_source(batches_of({}), model_.inputs);
  auto empty_ptq = fresh_ptq();
  EXPECT_THROW(quant::calibrate(*empty_ptq, *none, {}), Error);
}

TEST_F(Calibration, SampleGeneratorStacksBatchesAndGivesTheDatasetsModel) {
  auto ptq = fresh_ptq();
  auto source = quant::sample_generator_calibration_source(samples(10), 4, model_.inputs);
  quant::CalibrationLoopOptions o;  // no batch_nums: until the generator ends
  const quant::CalibrationRun run = quant::calibrate(*ptq, *source, o);
  EXPECT_EQ(run.batches, 3u);  // 4 + 4 + 2
  EXPECT_EQ(run.calibrated_samples, 10u);
  EXPECT_TRUE(run.held_back.empty());

  auto from_dataset = fresh_ptq();
  auto data_source = quant::dataset_calibration_source(*data_, 4, model_.inputs);
  quant::calibrate(*from_dataset, *data_source, o);
  EXPECT_EQ(model_bytes(*ptq), model_bytes(*from_dataset));

  // batch_nums below the data: the samples after the calibrated ones are held back.
  auto part = fresh_ptq();
  auto part_source = quant::sample_generator_calibration_source(samples(10), 4, model_.inputs);
  o.batch_nums = 1;
  o.held_back_rows = [](size_t) { return size_t{5}; };
  const quant::CalibrationRun first = quant::calibrate(*part, *part_source, o);
  EXPECT_EQ(first.calibrated_samples, 4u);
  expect_rows_equal(first.held_back, rows(4, 5));
}

TEST_F(Calibration, ResumesFromACheckpointAndGivesTheUninterruptedModel) {
  test::TempDir tmp("calibration_loop");
  quant::CalibrationLoopOptions o;
  o.checkpoint = tmp.path("c.calibration");
  o.data_identity = "ten images";
  o.first_rows = 2;

  auto whole = fresh_ptq();
  auto whole_source = quant::sample_generator_calibration_source(samples(10), 4, model_.inputs);
  quant::CalibrationLoopOptions plain = o;
  plain.checkpoint.clear();
  quant::calibrate(*whole, *whole_source, plain);

  {  // The interrupted run: one batch observed, its state saved at the end.
    auto first = fresh_ptq();
    auto source = quant::sample_generator_calibration_source(samples(10), 4, model_.inputs);
    quant::CalibrationLoopOptions one = o;
    one.batch_nums = 1;
    EXPECT_EQ(quant::calibrate(*first, *source, one).resumed_batches, 0u);
  }
  auto resumed = fresh_ptq();
  auto source = quant::sample_generator_calibration_source(samples(10), 4, model_.inputs);
  const quant::CalibrationRun run = quant::calibrate(*resumed, *source, o);
  EXPECT_EQ(run.resumed_batches, 1u);
  EXPECT_EQ(run.batches, 3u);
  EXPECT_EQ(run.samples, 6u);  // this run's own
  EXPECT_EQ(run.calibrated_samples, 10u);
  expect_rows_equal(run.first_rows, rows(0, 2));  // from the replayed first batch
  EXPECT_EQ(model_bytes(*resumed), model_bytes(*whole));

  // With rows to hold back and the data used whole, the checkpoint holds the batches before the
  // last one: the resumed run defers the same batch and ends with the same model.
  {
    test::TempDir deferring("calibration_loop_deferred");
    quant::CalibrationLoopOptions held = o;
    held.checkpoint = deferring.path("d.calibration");
    held.held_back_rows = [](size_t) { return size_t{2}; };
    auto interrupted = fresh_ptq();
    auto first_source = quant::dataset_calibration_source(*data_, 4, model_.inputs);
    quant::CalibrationLoopOptions one = held;
    one.batch_nums = 1;
    quant::calibrate(*interrupted, *first_source, one);
    auto again = fresh_ptq();
    auto again_source = quant::dataset_calibration_source(*data_, 4, model_.inputs);
    quant::CalibrationRun resumed_run = quant::calibrate(*again, *again_source, held);
    EXPECT_EQ(resumed_run.resumed_batches, 1u);
    expect_rows_equal(resumed_run.held_back, rows(8, 2));
    quant::finish_calibration(*again, resumed_run);
    EXPECT_EQ(model_bytes(*again), model_bytes(*whole));
    auto third = fresh_ptq();
    auto third_source = quant::dataset_calibration_source(*data_, 4, model_.inputs);
    quant::CalibrationRun from_saved = quant::calibrate(*third, *third_source, held);
    EXPECT_EQ(from_saved.resumed_batches, 2u) << "the saved calibration stops before the deferred batch";
    expect_rows_equal(from_saved.held_back, rows(8, 2));
    quant::finish_calibration(*third, from_saved);
    EXPECT_EQ(model_bytes(*third), model_bytes(*whole));
  }

  // The checkpoint now holds all 3 batches: a run asking for fewer is refused.
  auto fewer = fresh_ptq();
  auto data_source = quant::dataset_calibration_source(*data_, 4, model_.inputs);
  quant::CalibrationLoopOptions one = o;
  one.batch_nums = 1;
  EXPECT_THROW(quant::calibrate(*fewer, *data_source, one), Error);
}

// A scalar model input given by a sample generator: fed as is, one value per batch; samples of
// one batch that disagree on it are refused.
TEST(CalibrationScalarInput, ASampleGeneratorsScalarIsFedAsIs) {
  const ir::Graph model = test::resnet_with_scalar_gain();
  data::DataOptions d;
  d.spec = "fashion-mnist:test";
  d.limit = 8;
  auto data = data::open_dataset(d);
  const Tensor images = data::BatchLoader(*data, 8).batch(0).inputs;
  const std::string image_input = model.inputs[0].name;
  auto samples = [&](std::vector<float> gains) {
    return [&images, &image_input, gains, i = size_t{0}]() mutable -> std::optional<quant::Feeds> {
      if (i == gains.size()) return std::nullopt;
      quant::Feeds f = runtime::feed_rows({{image_input, images}}, static_cast<int64_t>(i), 1);
      f["gain"] = Tensor::scalar(gains[i++]);
      return f;
    };
  };
  quant::PTQ ptq{quant::QuantConfig{}};
  ptq.quantize(model);
  auto source = quant::sample_generator_calibration_source(samples(std::vector<float>(8, 2.f)), 4, model.inputs);
  quant::CalibrationLoopOptions o;
  o.first_rows = 2;
  const quant::CalibrationRun run = quant::calibrate(ptq, *source, o);
  EXPECT_EQ(run.batches, 2u);
  ASSERT_TRUE(run.first_rows.count("gain"));
  EXPECT_EQ(run.first_rows.at("gain").rank(), 0);
  EXPECT_EQ(run.first_rows.at("gain").to_float_vector(), (std::vector<float>{2.f}));
  EXPECT_EQ(run.first_rows.at(image_input).dim(0), 2);

  quant::PTQ mixed_ptq{quant::QuantConfig{}};
  mixed_ptq.quantize(model);
  auto mixed = quant::sample_generator_calibration_source(samples({1.f, 1.f, 2.f, 1.f}), 4, model.inputs);
  try {
    quant::calibrate(mixed_ptq, *mixed, {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the scalar input 'gain' differs"), std::string::npos) << e.what();
  }
}

}  // namespace
