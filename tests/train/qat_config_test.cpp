// QAT config files read by the library (train::load_qat_config_yaml): training keys set only when
// named, PTQ keys into the QuantConfig, unknown keys and bad values refused naming the key.
#include <gtest/gtest.h>

#include <fstream>

#include "slimquant/train/qat_config.h"
#include "test_util.h"

using namespace slimquant;

namespace {

// The ErrorKind and message load_qat_config_yaml throws for `yaml`.
std::pair<ErrorKind, std::string> load_error(const std::string& yaml) {
  test::TempDir tmp("qat_config_error");
  std::ofstream(tmp.path("qat.yaml")) << yaml;
  try {
    train::load_qat_config_yaml(tmp.path("qat.yaml"));
  } catch (const Error& e) {
    return {e.kind(), e.what()};
  }
  return {ErrorKind::kInternal, "no error"};
}

}  // namespace

TEST(QATConfig, ReadsTrainingAndQuantizationKeys) {
  test::TempDir tmp("qat_config");
  std::ofstream(tmp.path("qat.yaml")) << "epochs: 3\nlr: 0.02\nbatch_size: 16\nbatch_nums: 4\nsteps_per_epoch: 7\n"
                                         "temperature: 2.5\nweight_decay: 0.0001\nmomentum: 0.8\nseed: 42\n"
                                         "lr_schedule: step\noptimizer: adamw\nweight_quanter: pact\n"
                                         "act_quanter: lsq_plus\ncheckpoint: run.ckpt\nnesterov: true\n"
                                         "distill: true\nalgo: mse\nquantizable_op_type: [Conv]\n";
  const train::QATConfigFile file = train::load_qat_config_yaml(tmp.path("qat.yaml"));
  EXPECT_EQ(file.quant.global().activation, "mse");
  EXPECT_EQ(file.quant.quantizable_op_type, (std::vector<std::string>{"Conv"}));
  train::QATOptions o;
  file.training.apply_to(o);
  EXPECT_EQ(o.epochs, 3);
  EXPECT_FLOAT_EQ(o.lr, 0.02f);
  EXPECT_EQ(o.batch_size, 16u);
  EXPECT_EQ(o.calib_batches, 4u);
  EXPECT_EQ(o.steps_per_epoch, 7u);
  EXPECT_FLOAT_EQ(o.temperature, 2.5f);
  EXPECT_FLOAT_EQ(o.optimizer.weight_decay, 0.0001f);
  EXPECT_FLOAT_EQ(o.optimizer.momentum, 0.8f);
  EXPECT_EQ(o.seed, 42u);
  EXPECT_EQ(o.lr_schedule, "step");
  EXPECT_EQ(o.optimizer.type, "adamw");
  EXPECT_EQ(o.weight_quanter, "pact");
  EXPECT_EQ(o.act_quanter, "lsq_plus");
  EXPECT_EQ(o.checkpoint, "run.ckpt");
  EXPECT_TRUE(o.optimizer.nesterov);
  EXPECT_TRUE(o.distill);
}

// Keys the file does not name stay unset: the options keep their defaults.
TEST(QATConfig, UnnamedKeysLeaveDefaults) {
  test::TempDir tmp("qat_config_partial");
  std::ofstream(tmp.path("qat.yaml")) << "epochs: 0\n";
  const train::QATConfigFile file = train::load_qat_config_yaml(tmp.path("qat.yaml"));
  EXPECT_EQ(file.training.epochs, 0);
  EXPECT_FALSE(file.training.lr.has_value());
  EXPECT_FALSE(file.training.optimizer.has_value());
  train::QATOptions o;
  o.batch_size = 5;
  file.training.apply_to(o);
  EXPECT_EQ(o.epochs, 0);
  EXPECT_EQ(o.batch_size, 5u);
  EXPECT_EQ(o.optimizer.type, train::QATOptions().optimizer.type);
  EXPECT_FLOAT_EQ(o.lr, train::QATOptions().lr);
}

TEST(QATConfig, UnknownKeyIsNamed) {
  const auto [kind, message] = load_error("epoch: 3\n");
  EXPECT_EQ(kind, ErrorKind::kInvalidArgument);
  EXPECT_NE(message.find("unknown key 'epoch'"), std::string::npos) << message;
}

TEST(QATConfig, BadValuesNameTheKey) {
  auto [kind, message] = load_error("epochs: three\n");
  EXPECT_EQ(kind, ErrorKind::kInvalidArgument);
  EXPECT_NE(message.find("config key 'epochs' must be a non-negative integer, got 'three'"), std::string::npos)
      << message;
  std::tie(kind, message) = load_error("lr: fast\n");
  EXPECT_NE(message.find("config key 'lr' must be a finite number, got 'fast'"), std::string::npos) << message;
  std::tie(kind, message) = load_error("lr: 0\n");
  EXPECT_NE(message.find("config key 'lr' must be greater than"), std::string::npos) << message;
  std::tie(kind, message) = load_error("batch_size: 0\n");
  EXPECT_NE(message.find("config key 'batch_size' must be at least 1"), std::string::npos) << message;
  std::tie(kind, message) = load_error("momentum: -0.5\n");
  EXPECT_NE(message.find("config key 'momentum' must be at least"), std::string::npos) << message;
  std::tie(kind, message) = load_error("epochs: 2000000\n");
  EXPECT_NE(message.find("config key 'epochs' is too large"), std::string::npos) << message;
  std::tie(kind, message) = load_error("distill: maybe\n");
  EXPECT_EQ(kind, ErrorKind::kInvalidArgument);
  EXPECT_NE(message.find("config key 'distill' must be true or false, got 'maybe'"), std::string::npos) << message;
}

TEST(QATConfig, MissingFileIsAnIoError) {
  EXPECT_THROW(
      try { train::load_qat_config_yaml("/nonexistent/qat.yaml"); } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kIo);
        throw;
      },
      Error);
}
