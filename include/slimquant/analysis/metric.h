#pragma once
// Accumulating metrics: update() per batch, value() at the end. Accuracy metrics read labels;
// fidelity metrics compare against reference (FP32) outputs and need no labels.
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "slimquant/core/tensor.h"

namespace slimquant::analysis {

class Metric {
 public:
  virtual ~Metric() = default;
  virtual std::string name() const = 0;
  // outputs: the model's first output for the batch, [n, classes...]. labels: n labels (may be
  // empty for label-free metrics). reference: the FP32 model's outputs for the same batch
  // (undefined tensor when the metric does not need it).
  virtual void update(const Tensor& outputs, const std::vector<int64_t>& labels, const Tensor& reference) = 0;
  virtual double value() const = 0;
  virtual size_t samples() const = 0;
  virtual void reset() = 0;
  virtual bool needs_labels() const { return false; }
  virtual bool needs_reference() const { return false; }
  // True when larger values are better (accuracy); false for losses/errors.
  virtual bool higher_is_better() const { return true; }
  virtual std::unique_ptr<Metric> clone_empty() const = 0;
  // The accumulated state, exact enough that load_state() continues as if never interrupted
  // (analysis checkpoints). The defaults throw kUnsupported: metrics without them can still be
  // used, only not checkpointed.
  virtual nlohmann::json state() const;
  virtual void load_state(const nlohmann::json& state);
};

// "top1", "top5", "cosine" (1 - cosine similarity to reference, lower is better), "sqnr" (dB vs
// reference), "top1_agreement" (fraction of argmax matching the reference). Throws
// kInvalidArgument listing the known names for anything else.
std::unique_ptr<Metric> make_metric(const std::string& name);

}  // namespace slimquant::analysis
