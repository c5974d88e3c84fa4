#pragma once
// Shared setup for the analysis tests: small calibrated PTQs on the fixture models.
#include <memory>
#include <string>

#include "slimquant/data/batch.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/ptq.h"
#include "test_util.h"

namespace slimquant::test {

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
  auto ptq = std::make_unique<quant::PTQ>(cfg);
  ptq->quantize(ir::load_onnx(fixture_model(model)));
  auto calib = data::open_dataset(fmnist("train", 128));
  data::BatchLoader loader(*calib, 32);
  for (size_t i = 0; i < loader.num_batches(); ++i) ptq->sample(loader.batch(i).inputs);
  return ptq;
}

}  // namespace slimquant::test
