#pragma once
#include <string>

#include "slimquant/analysis/metric.h"
#include "slimquant/data/dataset.h"
#include "slimquant/runtime/session.h"

namespace slimquant::analysis {

struct EvalOptions {
  size_t batch_size = 64;
  std::string progress_label = "eval";
  // Needed by fidelity metrics (cosine, sqnr, top1_agreement): the FP32 model's session.
  runtime::Session* reference = nullptr;
};

struct EvalResult {
  double value = 0;
  size_t samples = 0;
  double seconds = 0;
};

// Runs the whole data set through `session` (first output) and accumulates `metric`. Throws
// kInvalidArgument when the metric needs labels the data lacks, or a reference that is missing.
EvalResult evaluate(runtime::Session& session, const data::Dataset& dataset, Metric& metric,
                    const EvalOptions& options = {});

}  // namespace slimquant::analysis
