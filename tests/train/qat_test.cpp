// QAT flow on the fixture models with small data subsets: training lowers the loss, the exported
// QDQ model is valid ONNX and its integer execution agrees with the training graph's simulation,
// checkpoints resume at the next epoch and refuse other configurations, distillation needs no labels.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "slimquant/data/batch.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/lowering.h"
#include "slimquant/train/loss.h"
#include "slimquant/train/qat.h"
#include "test_util.h"

using namespace slimquant;

namespace {

// Training runs many small parallel regions; on a shared, oversubscribed machine OpenMP's spinning
// barriers make them tens of times slower. One thread keeps these tests fast and deterministic.
class OneThread {
 public:
  OneThread() : prev_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(prev_); }

 private:
  int prev_;
};

std::unique_ptr<data::Dataset> fmnist(const std::string& split, size_t limit) {
  data::DataOptions o;
  o.spec = "fashion-mnist:" + split;
  o.limit = limit;
  return data::open_dataset(o);
}

// The same samples with the labels hidden (an unlabelled data set).
class Unlabelled : public data::Dataset {
 public:
  explicit Unlabelled(const data::Dataset& d) : d_(d), name_(d.name() + " (no labels)") {}
  const std::string& name() const override { return name_; }
  size_t size() const override { return d_.size(); }
  const Shape& sample_shape() const override { return d_.sample_shape(); }
  void load(size_t i, float* dst) const override { d_.load(i, dst); }
  bool has_labels() const override { return false; }
  int64_t label(size_t) const override { fail(ErrorKind::kInvalidArgument, "no labels"); }

 private:
  const data::Dataset& d_;
  std::string name_;
};

double mean_ce(train::QAT& qat, const data::Dataset& d) {
  data::BatchLoader loader(d, 64);
  double sum = 0;
  size_t n = 0;
  for (const auto& b : loader) {
    sum += train::softmax_cross_entropy(qat.simulate(b.inputs), b.labels).loss * static_cast<double>(b.size());
    n += b.size();
  }
  return sum / static_cast<double>(n);
}

int64_t argmax_row(const float* p, int64_t c) { return std::max_element(p, p + c) - p; }

train::QATOptions small_options() {
  train::QATOptions o;
  o.batch_size = 32;
  o.calib_batches = 2;  // default optimizer: sgd, lr 1e-3
  return o;
}

}  // namespace

TEST(QATFlow, TrainingLowersLossAndExportAgreesWithSimulation) {
  OneThread one_thread;
  auto train_set = fmnist("train", 256);
  auto test_set = fmnist("test", 256);
  train::QATOptions o = small_options();
  o.epochs = 2;
  train::QAT qat(quant::QuantConfig(), o);
  qat.prepare(ir::load_onnx(test::fixture_model("mobilenetv2_small")), train_set.get());
  // One quanter per quantized activation tensor and weight; all Conv/Gemm layers found.
  ASSERT_GT(qat.layers().size(), 10u);
  EXPECT_EQ(qat.quanters().at(qat.layers()[0].weight)->name(), "lsq_plus");
  const double before = mean_ce(qat, *train_set);
  std::vector<double> epoch_loss;
  qat.fit(*train_set, [&](const train::EpochReport& r) { epoch_loss.push_back(r.mean_loss); });
  ASSERT_EQ(epoch_loss.size(), 2u);
  const double after = mean_ce(qat, *train_set);
  EXPECT_LT(after, before) << "training loss did not decrease";
  EXPECT_LT(epoch_loss[1], epoch_loss[0]);

  ir::Graph qdq = qat.convert();
  EXPECT_NO_THROW(ir::check_onnx(qdq));
  size_t q = 0, dq = 0;
  for (const auto& n : qdq.nodes) q += n.op_type == "QuantizeLinear", dq += n.op_type == "DequantizeLinear";
  EXPECT_GT(q, 10u);
  EXPECT_GT(dq, q);  // weights have a DequantizeLinear of their own
  runtime::Session int8 = quant::make_int8_session(qdq);
  data::BatchLoader loader(*test_set, 128);
  size_t agree = 0, correct_sim = 0, correct_int8 = 0, n = 0;
  for (const auto& b : loader) {
    Tensor sim = qat.simulate(b.inputs);
    Tensor real = int8.run_single(b.inputs);
    ASSERT_EQ(sim.shape(), real.shape());
    const int64_t c = sim.dim(1);
    for (size_t i = 0; i < b.size(); ++i) {
      const int64_t ps = argmax_row(sim.data<float>() + i * c, c), pr = argmax_row(real.data<float>() + i * c, c);
      agree += ps == pr;
      correct_sim += ps == b.labels[i];
      correct_int8 += pr == b.labels[i];
      ++n;
    }
  }
  EXPECT_GE(static_cast<double>(agree) / n, 0.97) << "integer execution and simulation disagree";
  EXPECT_NEAR(static_cast<double>(correct_sim) / n, static_cast<double>(correct_int8) / n, 0.02);
  EXPECT_GT(static_cast<double>(correct_int8) / n, 0.7);
}

TEST(QATFlow, ResumesFromCheckpointAtTheNextEpoch) {
  OneThread one_thread;
  test::TempDir tmp("qat_resume");
  auto train_set = fmnist("train", 96);
  const ir::Graph model = ir::load_onnx(test::fixture_model("vit_small"));
  train::QATOptions o = small_options();
  o.epochs = 2;
  o.steps_per_epoch = 2;
  o.act_quanter = "lsq_plus";

  // Uninterrupted run.
  train::QAT full(quant::QuantConfig(), o);
  full.prepare(model, train_set.get());
  full.fit(*train_set);

  // Interrupted after epoch 1 (the callback stands in for a crash), then a fresh process resumes.
  o.checkpoint = tmp.path("qat.ckpt");
  {
    train::QAT first(quant::QuantConfig(), o);
    first.prepare(model, train_set.get());
    EXPECT_THROW(first.fit(*train_set, [](const train::EpochReport& r) {
      if (r.epoch == 1) throw std::runtime_error("stop");
    }), std::runtime_error);
  }
  ASSERT_TRUE(std::filesystem::exists(o.checkpoint));
  train::QAT resumed(quant::QuantConfig(), o);
  resumed.prepare(model, train_set.get());
  std::vector<int> epochs;
  resumed.fit(*train_set, [&](const train::EpochReport& r) { epochs.push_back(r.epoch); });
  EXPECT_EQ(epochs, std::vector<int>{2});
  EXPECT_EQ(resumed.optimizer().steps(), 4);
  // Same data order, same state: the resumed parameters equal the uninterrupted run's.
  for (train::Parameter* p : full.graph().parameters()) {
    train::Parameter* r = resumed.graph().parameter(p->name);
    ASSERT_NE(r, nullptr) << p->name;
    for (int64_t i = 0; i < p->value.numel(); ++i)
      ASSERT_NEAR(p->value.data<float>()[i], r->value.data<float>()[i], 1e-5) << p->name << "[" << i << "]";
  }

  // A checkpoint of another configuration or model is refused, naming what differs.
  train::QATOptions other = o;
  other.lr = 5e-4f;
  train::QAT mismatch(quant::QuantConfig(), other);
  mismatch.prepare(model, train_set.get());
  try {
    mismatch.load_checkpoint(o.checkpoint);
    FAIL() << "expected the checkpoint to be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("lr was"), std::string::npos) << e.what();
  }
  train::QAT other_model(quant::QuantConfig(), o);
  other_model.prepare(ir::load_onnx(test::fixture_model("mobilenetv2_small")), train_set.get());
  EXPECT_THROW(other_model.load_checkpoint(o.checkpoint), Error);

  // Corrupted bytes are refused by the checksums, naming the file: one bit of the last tensor's
  // payload (a weight or optimizer value), or of the header.
  std::string bytes;
  {
    std::ifstream in(o.checkpoint, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto expect_corrupt = [&](size_t at, const std::string& words) {
    std::string bad = bytes;
    bad[at] = static_cast<char>(bad[at] ^ 0x10);
    const std::string path = tmp.path("corrupt.ckpt");
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bad;
    try {
      resumed.load_checkpoint(path);
      FAIL() << "a checkpoint with byte " << at << " flipped was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidData) << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  expect_corrupt(bytes.size() - 3, "fails its CRC-32 check");
  expect_corrupt(20, "header fails the CRC-32 check");
  resumed.load_checkpoint(o.checkpoint);  // the intact file still loads
}

TEST(QATFlow, DistillationTrainsWithoutLabels) {
  OneThread one_thread;
  auto labelled = fmnist("train", 64);
  Unlabelled train_set(*labelled);
  const ir::Graph model = ir::load_onnx(test::fixture_model("vit_small"));
  train::QATOptions o = small_options();
  o.steps_per_epoch = 2;
  o.act_quanter = "moving_abs_max";
  o.weight_quanter = "abs_max";
  {
    train::QAT no_distill(quant::QuantConfig(), o);
    no_distill.prepare(model, &train_set);
    try {
      no_distill.fit(train_set);
      FAIL() << "expected a refusal: no labels without distill";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("no labels"), std::string::npos) << e.what();
    }
  }
  o.distill = true;
  o.temperature = 2.0f;
  train::QAT qat(quant::QuantConfig(), o);
  qat.prepare(model, &train_set);
  std::vector<double> losses;
  qat.fit(train_set, [&](const train::EpochReport& r) { losses.push_back(r.mean_loss); });
  ASSERT_EQ(losses.size(), 1u);
  EXPECT_GT(losses[0], 0.0);       // a quantized student differs from its teacher
  EXPECT_LT(losses[0], 1.0);       // but starts close to it (KL of a calibrated model)
  EXPECT_NO_THROW(ir::check_onnx(qat.convert()));
}

TEST(QATFlow, QuantConfigRulesChooseQuantersPerType) {
  OneThread one_thread;
  auto train_set = fmnist("train", 32);
  quant::QuantConfig cfg;
  quant::QuantRule gemm;
  gemm.weight_quanter = "abs_max";
  gemm.activation_quanter = "moving_abs_max";
  cfg.add_type_config({"Gemm"}, gemm);
  train::QATOptions o = small_options();
  train::QAT qat(cfg, o);
  qat.prepare(ir::load_onnx(test::fixture_model("resnet_small")), train_set.get());
  size_t gemms = 0;
  for (const auto& l : qat.layers()) {
    const std::string want_w = l.op_type == "Gemm" ? "abs_max" : "lsq_plus";
    EXPECT_EQ(qat.quanters().at(l.weight)->name(), want_w) << l.name;
    gemms += l.op_type == "Gemm";
  }
  EXPECT_GE(gemms, 1u);
  quant::QuantRule bad;
  bad.activation_quanter = "lsq";
  quant::QuantConfig bad_cfg;
  bad_cfg.add_type_config({"Conv"}, bad);
  train::QAT broken(bad_cfg, o);
  EXPECT_THROW(broken.prepare(ir::load_onnx(test::fixture_model("resnet_small")), train_set.get()), Error);

  test::TempDir tmp("qat_yaml");
  std::ofstream(tmp.path("qat.yaml")) << "algo: abs_max\nepochs: 2\nweight_quanter: pact\n"
                                          "type_config:\n  Gemm: {act_quanter: lsq_plus, weight_quanter: abs_max}\n";
  std::map<std::string, std::string> extra;
  auto loaded = quant::load_quant_config_yaml(tmp.path("qat.yaml"), quant::QuantConfig(), &extra);
  EXPECT_EQ(extra.at("weight_quanter"), "pact");
  ir::Node fc;
  fc.op_type = "Gemm";
  fc.name = "/fc";
  EXPECT_EQ(loaded.rule_for(fc).activation_quanter, "lsq_plus");
  EXPECT_EQ(loaded.rule_for(fc).weight_quanter, "abs_max");
}

TEST(QATFlow, NamedQuanterSpecsCarrySettingsPerRule) {
  OneThread one_thread;
  auto train_set = fmnist("train", 64);
  quant::QuantConfig cfg;
  quant::QuantRule gemm;
  gemm.activation_quanter = "clip#1";
  gemm.weight_quanter = "tensor_lsq#2";
  cfg.add_type_config({"Gemm"}, gemm);
  train::QATOptions o = small_options();
  train::QuanterSpec clip;
  clip.type = "pact";
  clip.init_value = 3.5f;
  clip.lr_scale = 10.0f;
  train::QuanterSpec per_tensor;
  per_tensor.type = "lsq_plus";
  per_tensor.per_channel = false;
  o.quanter_specs["clip#1"] = clip;
  o.quanter_specs["tensor_lsq#2"] = per_tensor;
  train::QAT qat(cfg, o);
  qat.prepare(ir::load_onnx(test::fixture_model("resnet_small")), train_set.get());
  size_t gemms = 0;
  for (const auto& l : qat.layers()) {
    if (l.op_type != "Gemm") {
      EXPECT_EQ(qat.quanters().at(l.weight)->export_params().scale.size(),
                static_cast<size_t>(qat.float_graph().initializer(l.weight)->dim(0)))
          << "the default weight quanter is per channel";
      continue;
    }
    ++gemms;
    auto* pact = dynamic_cast<train::PACTQuanter*>(qat.quanters().at(l.activations.at(0)));
    ASSERT_NE(pact, nullptr);
    EXPECT_FLOAT_EQ(pact->alpha().value.data<float>()[0], 3.5f);  // init_value, not the calibration
    EXPECT_FLOAT_EQ(pact->alpha().lr_scale, 10.0f);
    EXPECT_EQ(qat.quanters().at(l.weight)->export_params().scale.size(), 1u);  // per tensor
  }
  EXPECT_GE(gemms, 1u);

  // New training settings keep the quanters and restart the optimizer.
  data::BatchLoader loader(*train_set, 32);
  qat.train_step(loader.batch(0), 1e-3f);
  EXPECT_EQ(qat.optimizer().steps(), 1);
  train::QATOptions next = o;
  next.optimizer.type = "adam";
  next.lr = 0.0f;
  next.epochs = 1;
  next.steps_per_epoch = 1;
  next.quanter_specs.clear();  // ignored: the quanters are in place
  qat.set_training_options(next);
  EXPECT_EQ(qat.optimizer().steps(), 0);
  EXPECT_FLOAT_EQ(qat.options().lr, 1e-4f);
  EXPECT_EQ(qat.options().quanter_specs.size(), 2u);
  qat.fit(*train_set);
  EXPECT_EQ(qat.optimizer().steps(), 1);
  next.optimizer.type = "lion";
  EXPECT_THROW(qat.set_training_options(next), Error);
  EXPECT_EQ(qat.options().optimizer.type, "adam");  // unchanged after a refused change

  per_tensor.init_value = 1.0f;
  o.quanter_specs["bad#3"] = per_tensor;
  EXPECT_THROW(train::QAT(cfg, o), Error);  // init_value is PACT's
}

// QAT trains quanters on weights and activations: a weight-only configuration is refused, naming
// the command that quantizes that way.
TEST(QATFlow, WeightOnlyModeIsRefusedWithTheCommandToUse) {
  quant::QuantConfig cfg;
  cfg.mode = quant::QuantMode::kWeightOnly;
  try {
    train::QAT qat(cfg, train::QATOptions());
    FAIL() << "weight-only QAT was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("quantize --mode weight-only"), std::string::npos) << e.what();
  }
}

TEST(QATCli, TrainsExportsReportsAndResumes) {
  test::TempDir tmp("qat_cli");
  const std::string out = tmp.path("q.onnx");
  const std::string args = "qat " + test::fixture_model("vit_small") +
                           " fashion-mnist:train --limit 64 --batch-size 16 --steps-per-epoch 2 --calib-batches 2"
                           " --eval-dataset fashion-mnist:test --eval-limit 64 --json -o " + out;
  const std::string env = "OMP_NUM_THREADS=1";  // see OneThread
  auto r = test::run_cli(args, env);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(r.output.substr(r.output.rfind('{')));
  for (const char* key : {"fp32_top1", "ptq_top1", "qat_top1", "seconds_per_epoch"}) EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_GT(j["qat_top1"].get<double>(), 0.5);
  EXPECT_EQ(j["epochs_run"], 1);
  EXPECT_TRUE(std::filesystem::exists(out));
  EXPECT_TRUE(std::filesystem::exists(out + ".ckpt"));
  // ONNX Runtime gives the same top-1 on the same 64 test images (within one image of rounding).
  if (std::system("command -v node >/dev/null 2>&1") == 0 &&
      std::filesystem::exists(test::source_path("bench/node_modules/onnxruntime-node/package.json"))) {
    const std::string cmd = "NODE_PATH=" + test::source_path("bench/node_modules") + " node " +
                            test::source_path("bench/ort_eval.js") + " " + out + " --limit 64 2>&1";
    FILE* pipe = popen(cmd.c_str(), "r");
    std::string ort;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) ort.append(buf, n);
    ASSERT_EQ(pclose(pipe), 0) << ort;
    const double ort_top1 = nlohmann::json::parse(ort.substr(ort.rfind('{')))["top1"].get<double>();
    EXPECT_NEAR(ort_top1, j["qat_top1"].get<double>(), 1.0 / 64 + 1e-9);
  }
  // Rerun: the checkpoint says the epoch is done; nothing is trained again.
  r = test::run_cli(args + " --no-eval", env);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("already done"), std::string::npos) << r.output;
  // Bad input.
  EXPECT_EQ(test::run_cli(args + " --act-quanter lsq", env).exit_code, 5);
  std::ofstream(tmp.path("bad.yaml")) << "epochs: 1\nweight_quanter: bogus\n";
  r = test::run_cli(args + " --config " + tmp.path("bad.yaml"), env);
  EXPECT_EQ(r.exit_code, 5);
  EXPECT_NE(r.output.find("unknown weight quanter 'bogus'"), std::string::npos) << r.output;
  EXPECT_EQ(test::run_cli("qat " + test::fixture_model("vit_small") + " fashion-mnist:train -o " +
                          tmp.path("missing/dir/q.onnx")).exit_code, 7);
  r = test::run_cli(args + " --side-input mask=" + tmp.path("mask.npy"), env);
  EXPECT_EQ(r.exit_code, 5);
  EXPECT_NE(r.output.find("qat trains single-input models"), std::string::npos) << r.output;
}
