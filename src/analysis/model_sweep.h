#pragma once
// The sweep of the user-evaluation analyses (eval_function, --eval-command): every layer's model is
// built and evaluated whole, one at a time; the checkpoint records each finished model's metric, so a
// failing evaluation loses no finished layer and a rerun continues after the last one.
#include <functional>
#include <string>
#include <vector>

#include "slimquant/analysis/ptq_analysis.h"

namespace slimquant::analysis {

struct ModelSweepLayer {
  std::string name, op_type;
  std::function<ir::Graph()> build;  // this layer's model, built only when it is evaluated
};

// `evaluate(model, is_base)`. `build_base` empty: the base model is not evaluated (base_metric 0).
// Checkpoint state: {"base": metric or null, "done": {layer: metric}}; options.fingerprint must name
// the evaluation. batches_resumed counts the layers restored from the checkpoint.
SweepResult sweep_models(const std::function<ir::Graph()>& build_base, const std::vector<ModelSweepLayer>& layers,
                         const std::function<double(const ir::Graph& model, bool is_base)>& evaluate,
                         const SweepOptions& options);

// A Metric carrying only a name and direction, so rank_layers orders user-evaluated results.
std::unique_ptr<Metric> direction_only_metric(const std::string& name, bool higher_is_better);

}  // namespace slimquant::analysis
