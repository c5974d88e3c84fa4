#pragma once
// Shared setup for the analysis tests: small calibrated PTQs on the fixture models.
#include <omp.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "slimquant/data/batch.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/ptq.h"
#include "test_util.h"

namespace slimquant::test {

// One OpenMP thread while a test runs (restored after): these tests check numbers, not speed, and
// on a shared, overloaded machine OpenMP's spinning worker threads make them over ten times slower.
class SingleThread {
 public:
  SingleThread() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~SingleThread() { omp_set_num_threads(saved_); }
  SingleThread(const SingleThread&) = delete;
  SingleThread& operator=(const SingleThread&) = delete;

 private:
  int saved_;
};

// The same for the CLI run as a subprocess.
inline const char* kSingleThreadEnv = "OMP_NUM_THREADS=1";
inline CommandResult run_cli_single_threaded(const std::string& args) { return run_cli(args, kSingleThreadEnv); }

inline data::DataOptions fmnist(const std::string& split, size_t limit) {
  data::DataOptions o;
  o.spec = "fashion-mnist:" + split;
  o.limit = limit;
  return o;
}

// The fixture model quantized with `algo`, calibrated on 4 batches of 32 training images.
inline std::unique_ptr<quant::PTQ> calibrated_ptq(const std::string& model, const std::string& algo = "KL") {
  quant::QuantConfig cfg;
  cfg.global().activation = algo;
  cfg.weight_bits = 8;  // the same model on every CPU (auto would pick 7 without VNNI)
  auto ptq = std::make_unique<quant::PTQ>(cfg);
  ptq->quantize(ir::load_onnx(fixture_model(model)));
  auto calib = data::open_dataset(fmnist("train", 128));
  data::BatchLoader loader(*calib, 32);
  for (size_t i = 0; i < loader.num_batches(); ++i) ptq->sample(loader.batch(i).inputs);
  return ptq;
}

}  // namespace slimquant::test
