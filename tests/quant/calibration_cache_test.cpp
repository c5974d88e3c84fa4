// Calibration cache (is_use_cache_file) and the PostTrainingQuantization wrapper: an interrupted
// calibration resumed from disk gives exactly the uninterrupted result; caches of another model or
// config are refused; sample_generator and Dataset sources agree; bad input is named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <sstream>

#include "slimquant/core/npy.h"
#include "slimquant/data/batch.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/observer.h"
#include "slimquant/quant/post_training_quantization.h"
#include "slimquant/quant/ptq.h"
#include "multi_input_model.h"
#include "test_util.h"

using namespace slimquant;

namespace {

Tensor random_tensor(Shape shape, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, scale);
  Tensor t(DType::kFloat32, shape);
  for (float& v : t.values<float>()) v = normal(rng);
  return t;
}

void expect_same_params(const QuantParam& a, const QuantParam& b) {
  ASSERT_EQ(a.scale.size(), b.scale.size());
  for (size_t i = 0; i < a.scale.size(); ++i) {
    EXPECT_EQ(a.scale[i], b.scale[i]);
    EXPECT_EQ(a.zero_point[i], b.zero_point[i]);
  }
}

TEST(ObserverState, SaveAfterTwoBatchesLoadAndContinueEqualsUninterrupted) {
  const Tensor b1 = random_tensor({4, 8, 5, 5}, 1, 1.0f), b2 = random_tensor({4, 8, 5, 5}, 2, 3.0f),
               b3 = random_tensor({4, 8, 5, 5}, 3, 0.5f);
  for (const auto& algo : quant::activation_algos()) {
    SCOPED_TRACE(algo);
    auto whole = quant::make_activation_observer(algo);
    for (const Tensor* b : {&b1, &b2, &b3}) whole->observe(*b);

    auto first = quant::make_activation_observer(algo);
    first->observe(b1);
    first->observe(b2);
    std::stringstream state(std::ios::in | std::ios::out | std::ios::binary);
    first->save_state(state);
    auto resumed = quant::make_activation_observer(algo);
    resumed->load_state(state);
    resumed->observe(b3);

    EXPECT_EQ(resumed->observed_count(), whole->observed_count());
    EXPECT_EQ(resumed->observed_batches(), whole->observed_batches());
    expect_same_params(resumed->params(quant::QuantScheme::kSymmetric), whole->params(quant::QuantScheme::kSymmetric));
    expect_same_params(resumed->params(quant::QuantScheme::kAsymmetric), whole->params(quant::QuantScheme::kAsymmetric));
  }
}

TEST(ObserverState, StateOfAnotherObserverIsRefused) {
  auto kl = quant::make_activation_observer("KL");
  kl->observe(random_tensor({2, 3}, 4, 1.f));
  std::stringstream state(std::ios::in | std::ios::out | std::ios::binary);
  kl->save_state(state);
  auto mse = quant::make_activation_observer("mse");
  try {
    mse->load_state(state);
    FAIL() << "loading KL state into mse must fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  }
  std::stringstream truncated(state.str().substr(0, 20), std::ios::in | std::ios::binary);
  auto kl2 = quant::make_activation_observer("KL");
  EXPECT_THROW(kl2->load_state(truncated), Error);
}

class CalibrationCache : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = ir::load_onnx(test::fixture_model("resnet_small"));
    data::DataOptions o;
    o.spec = "fashion-mnist:test";
    o.limit = 96;
    data_ = data::open_dataset(o);
  }
  ir::Graph model_;
  std::unique_ptr<data::Dataset> data_;
};

TEST_F(CalibrationCache, ResumedCalibrationGivesTheUninterruptedModel) {
  test::TempDir tmp("calib_cache");
  data::BatchLoader loader(*data_, 32);
  quant::PTQ whole{quant::QuantConfig{}};
  whole.quantize(model_);
  for (size_t i = 0; i < 3; ++i) whole.sample(loader.batch(i).inputs);

  {  // The "crashed" run: two batches, state on disk.
    quant::PTQ first{quant::QuantConfig{}};
    first.quantize(model_);
    EXPECT_FALSE(first.load_calibration_state(tmp.path("c.cache"), "data-a"));
    first.sample(loader.batch(0).inputs);
    first.sample(loader.batch(1).inputs);
    first.save_calibration_state(tmp.path("c.cache"), "data-a");
  }
  quant::PTQ resumed{quant::QuantConfig{}};
  resumed.quantize(model_);
  ASSERT_TRUE(resumed.load_calibration_state(tmp.path("c.cache"), "data-a"));
  EXPECT_EQ(resumed.samples_seen(), 2u);
  resumed.sample(loader.batch(2).inputs);
  EXPECT_EQ(ir::serialize_onnx(resumed.convert()), ir::serialize_onnx(whole.convert()));

  // Another config (algo), or other calibration data, must not silently reuse the cache.
  quant::PTQ other{quant::QuantConfig{quant::QuantRule{"mse", "channel_wise_abs_max", true}}};
  other.quantize(model_);
  EXPECT_NE(other.fingerprint(), resumed.fingerprint());
  try {
    other.load_calibration_state(tmp.path("c.cache"), "data-a");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
    EXPECT_NE(std::string(e.what()).find("another model"), std::string::npos) << e.what();
  }
  quant::PTQ same{quant::QuantConfig{}};
  same.quantize(model_);
  EXPECT_THROW(same.load_calibration_state(tmp.path("c.cache"), "data-b"), Error);
}

TEST_F(CalibrationCache, WrapperDeletesItsCacheAndMatchesPlainPtq) {
  test::TempDir tmp("ptq_wrapper");
  quant::PostTrainingQuantizationOptions o;
  o.model_dir = test::fixture_model("resnet_small");
  o.dataset = data_.get();
  o.batch_size = 32;
  o.batch_nums = 3;
  o.is_use_cache_file = true;
  o.cache_dir = tmp.path("cache");
  o.algo = "emd";  // the plain PTQ below reports emd, the first of "auto"'s candidates
  quant::PostTrainingQuantization wrapper(o);
  const ir::Graph& qdq = wrapper.quantize();
  EXPECT_EQ(wrapper.report().batches, 3u);
  EXPECT_EQ(wrapper.report().samples, 96u);
  EXPECT_TRUE(std::filesystem::exists(wrapper.cache_path())) << "kept until the model is saved";
  wrapper.save_quantized_model(tmp.path("q.onnx"));
  EXPECT_TRUE(std::filesystem::exists(tmp.path("q.onnx")));
  EXPECT_FALSE(std::filesystem::exists(wrapper.cache_path()));
  EXPECT_FALSE(std::filesystem::exists(o.cache_dir)) << "a cache_dir the run created is removed when empty";

  quant::PTQ plain{quant::QuantConfig{}};
  plain.quantize(model_);
  for (const auto& b : data::BatchLoader(*data_, 32)) plain.sample(b.inputs);
  EXPECT_EQ(ir::serialize_onnx(qdq), ir::serialize_onnx(plain.convert()));

  // The same samples through sample_generator (one per call, no batch dimension).
  size_t next = 0;
  quant::PostTrainingQuantizationOptions g = o;
  g.dataset = nullptr;
  g.is_use_cache_file = false;
  g.batch_nums.reset();
  g.sample_generator = [&]() -> std::optional<std::map<std::string, Tensor>> {
    if (next == data_->size()) return std::nullopt;
    return std::map<std::string, Tensor>{{"input", data_->sample(next++)}};
  };
  quant::PostTrainingQuantization from_generator(g);
  EXPECT_EQ(ir::serialize_onnx(from_generator.quantize()), ir::serialize_onnx(qdq));
  EXPECT_EQ(from_generator.report().batches, 3u);

  // The same batches through batch_generator (the documents' data_loader), as unnamed arrays.
  size_t next_batch = 0;
  quant::PostTrainingQuantizationOptions bg = g;
  bg.sample_generator = nullptr;
  bg.batch_size = 1;  // does not apply to whole batches
  bg.batch_generator = [&]() -> std::optional<std::map<std::string, Tensor>> {
    data::BatchLoader loader(*data_, 32);
    if (next_batch == loader.num_batches()) return std::nullopt;
    return std::map<std::string, Tensor>{{"", loader.batch(next_batch++).inputs}};
  };
  quant::PostTrainingQuantization from_batches(bg);
  EXPECT_EQ(ir::serialize_onnx(from_batches.quantize()), ir::serialize_onnx(qdq));
  EXPECT_EQ(from_batches.report().batches, 3u);
  EXPECT_EQ(from_batches.report().samples, 96u);
}

TEST_F(CalibrationCache, WrapperResumesFromALeftoverCache) {
  test::TempDir tmp("ptq_resume");
  data::BatchLoader loader(*data_, 32);
  quant::PostTrainingQuantizationOptions o;
  o.model_dir = test::fixture_model("resnet_small");
  o.dataset = data_.get();
  o.batch_size = 32;
  o.is_use_cache_file = true;
  o.cache_dir = tmp.path();
  quant::PostTrainingQuantization wrapper(o);
  {  // What an interrupted run with the same settings leaves behind: one batch observed.
    quant::PTQ crashed{quant::QuantConfig{}};
    crashed.quantize(model_);
    crashed.sample(loader.batch(0).inputs);
    crashed.save_calibration_state(wrapper.cache_path(), "batch_size=32;data=" + data_->name() + ";n=96");
  }
  const ir::Graph& qdq = wrapper.quantize();
  EXPECT_EQ(wrapper.report().resumed_batches, 1u);
  EXPECT_EQ(wrapper.report().samples, 64u) << "only the remaining batches run";
  quant::PTQ plain{quant::QuantConfig{}};
  plain.quantize(model_);
  for (const auto& b : loader) plain.sample(b.inputs);
  // The resumed observers weigh the same candidates and choose the same one.
  plain.select_activation_algo(wrapper.algo_choice().chosen);
  ir::Graph expected = plain.convert();
  expected.metadata["slimquant.activation_algo"] = wrapper.algo_choice().chosen;
  EXPECT_EQ(ir::serialize_onnx(qdq), ir::serialize_onnx(expected));
  wrapper.save_quantized_model(tmp.path("q.onnx"));
  EXPECT_TRUE(std::filesystem::exists(tmp.path())) << "a cache_dir the user made is kept";
  EXPECT_FALSE(std::filesystem::exists(wrapper.cache_path()));
}

// Without a cache_dir the calibration is kept in the user's cache until the model is saved: the
// same job run again after a failure (here: never saved) resumes it and writes the same model;
// saving deletes it.
TEST_F(CalibrationCache, AFinishedCalibrationIsKeptUntilTheModelIsSaved) {
  test::TempDir tmp("ptq_checkpoint");
  const char* before = std::getenv("SLIMQUANT_CALIBRATION_CACHE");
  const std::string restore = before ? before : "0";
  ::setenv("SLIMQUANT_CALIBRATION_CACHE", tmp.path("calibration").c_str(), 1);
  quant::PostTrainingQuantizationOptions o;
  o.model_dir = test::fixture_model("resnet_small");
  o.dataset = data_.get();
  o.batch_size = 32;
  quant::PostTrainingQuantization failed(o);
  const std::string first = ir::serialize_onnx(failed.quantize());
  const std::string kept = failed.calibration_checkpoint();
  ASSERT_FALSE(kept.empty());
  EXPECT_TRUE(std::filesystem::exists(kept));
  EXPECT_EQ(std::filesystem::path(kept).parent_path(), std::filesystem::path(tmp.path("calibration")));

  quant::PostTrainingQuantization again(o);
  EXPECT_EQ(ir::serialize_onnx(again.quantize()), first);
  // The last batch was compared on before it was observed (algo auto, the data used whole): the
  // checkpoint stops before it, so that the rerun compares on the same unseen samples.
  EXPECT_EQ(again.report().resumed_batches, 2u);
  EXPECT_EQ(again.report().samples, 32u) << "only the held-back batch runs again";
  EXPECT_EQ(again.calibration_checkpoint(), kept);
  again.save_quantized_model(tmp.path("q.onnx"));
  EXPECT_FALSE(std::filesystem::exists(kept));

  o.batch_size = 16;  // another job: its own checkpoint
  quant::PostTrainingQuantization other(o);
  other.quantize();
  EXPECT_NE(other.calibration_checkpoint(), kept);
  ::setenv("SLIMQUANT_CALIBRATION_CACHE", restore.c_str(), 1);
}

// A two-input model (an offset added to the classifier's input) calibrated from a data set plus a
// side input equals PTQ fed both inputs by hand; a different offset gives a different model, also
// with calibration checkpoints on: the unsaved first job's checkpoint is not resumed by a job whose
// side input holds other values under the same name.
TEST_F(CalibrationCache, SideInputFeedsTheSecondInput) {
  const ir::Graph g = test::resnet_with_offset_input();
  test::TempDir tmp("ptq_side_input");
  const char* before = std::getenv("SLIMQUANT_CALIBRATION_CACHE");
  const std::string restore = before ? before : "0";
  ::setenv("SLIMQUANT_CALIBRATION_CACHE", tmp.path("calibration").c_str(), 1);
  std::vector<std::string> checkpoints;
  ir::save_onnx(g, tmp.path("two.onnx"));
  Tensor offset(DType::kFloat32, {1, 64});
  for (int64_t i = 0; i < 64; ++i) offset.data<float>()[i] = 0.05f * static_cast<float>(i);
  write_npy(tmp.path("offset.npy"), offset);

  auto calibrate_with_side_input = [&](const std::string& file) {
    data::DataOptions o{.spec = "fashion-mnist:test", .limit = 64};
    o.side_inputs = {{"offset", file, 2}};
    auto ds = data::open_dataset(o);
    quant::PostTrainingQuantizationOptions po;
    po.model_dir = tmp.path("two.onnx");
    po.dataset = ds.get();
    po.batch_size = 32;
    po.algo = "emd";  // as the PTQ by hand below reports it
    quant::PostTrainingQuantization ptq(po);
    std::string model = ir::serialize_onnx(ptq.quantize());
    checkpoints.push_back(ptq.calibration_checkpoint());
    EXPECT_EQ(ptq.report().resumed_batches, 0u) << file;
    return model;
  };
  const std::string wrapped = calibrate_with_side_input(tmp.path("offset.npy"));

  quant::PTQ by_hand{quant::QuantConfig{}};
  by_hand.quantize(g);
  data::BatchLoader loader(*data_, 32);
  Tensor rows(DType::kFloat32, {32, 64});
  for (int64_t r = 0; r < 32; ++r) std::copy_n(offset.data<float>(), 64, rows.data<float>() + r * 64);
  for (size_t i = 0; i < 2; ++i) by_hand.sample({{"input", loader.batch(i).inputs}, {"offset", rows}});
  EXPECT_EQ(wrapped, ir::serialize_onnx(by_hand.convert()));

  for (float& v : offset.values<float>()) v *= 20.f;
  write_npy(tmp.path("big_offset.npy"), offset);
  EXPECT_NE(wrapped, calibrate_with_side_input(tmp.path("big_offset.npy"))) << "the side input must reach the model";
  ASSERT_EQ(checkpoints.size(), 2u);
  EXPECT_FALSE(checkpoints[0].empty());
  EXPECT_NE(checkpoints[0], checkpoints[1]);
  ::setenv("SLIMQUANT_CALIBRATION_CACHE", restore.c_str(), 1);
}

TEST_F(CalibrationCache, BadInputIsNamed) {
  quant::PostTrainingQuantizationOptions o;
  o.model_dir = test::fixture_model("resnet_small");
  o.dataset = data_.get();
  o.batch_size = 32;

  auto expect_error = [](quant::PostTrainingQuantizationOptions opts, ErrorKind kind, const std::string& words) {
    quant::PostTrainingQuantization p(std::move(opts));
    try {
      p.quantize();
      FAIL() << "expected an error mentioning: " << words;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), kind) << e.what();
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  auto unknown_type = o;
  unknown_type.quantizable_op_type = {"Conv", "conv3x3"};
  expect_error(unknown_type, ErrorKind::kInvalidArgument, "conv3x3");
  {  // A data set feeds one input: a two-input model is refused, naming its inputs and the way out.
    test::TempDir two("ptq_two_inputs");
    ir::Graph g = model_;
    g.inputs.push_back({"scale_factor", DType::kFloat32, std::vector<ir::Dim>{{-1, "n"}, {2, ""}}});
    ir::save_onnx(g, two.path("two.onnx"));
    auto two_inputs = o;
    two_inputs.model_dir = two.path("two.onnx");
    expect_error(two_inputs, ErrorKind::kInvalidArgument, "has 2 inputs ('input', 'scale_factor')");
    expect_error(two_inputs, ErrorKind::kInvalidArgument, "--side-input NAME=FILE.npy");
  }
  auto bad_cache = o;
  bad_cache.is_use_cache_file = true;
  bad_cache.cache_dir = "/proc/slimquant_cache";
  expect_error(bad_cache, ErrorKind::kIo, "/proc/slimquant_cache");
  // An empty data set: a .npy directory without samples, if the loader accepts one at all.
  test::TempDir tmp("ptq_empty");
  data::DataOptions empty_opts;
  empty_opts.spec = "npy:" + tmp.path();
  std::unique_ptr<data::Dataset> empty;
  try {
    empty = data::open_dataset(empty_opts);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidData) << e.what();
  }
  if (empty) {
    auto e = o;
    e.dataset = empty.get();
    expect_error(e, ErrorKind::kInvalidData, "empty");
  }
  // Non-finite activations name the batch and the tensor.
  auto huge = o;
  Tensor big(DType::kFloat32, {1, 1, 28, 28});
  for (float& v : big.values<float>()) v = 3e38f;
  huge.dataset = nullptr;
  huge.sample_generator = [&, n = 0]() mutable -> std::optional<std::map<std::string, Tensor>> {
    if (n++ == 1) return std::nullopt;
    return std::map<std::string, Tensor>{{"input", big}};
  };
  expect_error(huge, ErrorKind::kInvalidData, "calibration batch 0, tensor");

  // Not fatal: a skip that matches nothing, more batches asked for than the data has.
  auto lenient = o;
  lenient.skip_quant = {"/no/such/node*"};
  lenient.batch_nums = 50;
  quant::PostTrainingQuantization p(lenient);
  p.quantize();
  ASSERT_EQ(p.warnings().size(), 2u);
  EXPECT_NE(p.warnings()[0].find("/no/such/node*"), std::string::npos);
  EXPECT_NE(p.warnings()[1].find("only 3 batches"), std::string::npos) << p.warnings()[1];
  EXPECT_EQ(p.report().batches, 3u);
}

}  // namespace
