#pragma once
// Accumulating metrics: update() per batch, value() at the end. Accuracy metrics read labels;
// fidelity metrics compare against reference (FP32) outputs and need no labels.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "slimquant/core/tensor.h"

namespace slimquant::analysis {

// What a batch is scored against: class labels (classification) and text labels (recognition), one
// per sample, either empty when the data set has none. Converts implicitly from class labels alone.
struct BatchLabels {
  BatchLabels(const std::vector<int64_t>& classes);  // NOLINT(google-explicit-constructor)
  BatchLabels(const std::vector<int64_t>& classes, const std::vector<std::string>& texts);
  const std::vector<int64_t>& classes;
  const std::vector<std::string>& texts;
};

class Metric {
 public:
  virtual ~Metric() = default;
  virtual std::string name() const = 0;
  // outputs: the model's first output for the batch, [n, classes...]. labels: n labels (may be
  // empty for label-free metrics). reference: the FP32 model's outputs for the same batch
  // (undefined tensor when the metric does not need it).
  virtual void update(const Tensor& outputs, const BatchLabels& labels, const Tensor& reference) = 0;
  virtual double value() const = 0;
  virtual size_t samples() const = 0;
  virtual void reset() = 0;
  virtual bool needs_labels() const { return false; }
  // Text labels (npy:DIR's labels.txt): recognition metrics.
  virtual bool needs_text_labels() const { return false; }
  virtual bool needs_reference() const { return false; }
  // True when larger values are better (accuracy); false for losses/errors.
  virtual bool higher_is_better() const { return true; }
  virtual std::unique_ptr<Metric> clone_empty() const = 0;
  // Further figures worth reporting next to value(), e.g. {"mask_iou_min", 0.95}; empty by default.
  virtual std::vector<std::pair<std::string, double>> extra_values() const { return {}; }
  // The accumulated state, exact enough that load_state() continues as if never interrupted
  // (analysis checkpoints). The defaults throw kUnsupported: metrics without them can still be
  // used, only not checkpointed.
  virtual nlohmann::json state() const;
  virtual void load_state(const nlohmann::json& state);
};

// Settings some metrics need (the CLI's --keys).
struct MetricOptions {
  // Recognition key file for ctc_exact / ctc_char (see ctc.h).
  std::string keys_file;
  // mask_iou: a pixel is text where the probability exceeds this (PaddleOCR's DB thresh).
  double mask_threshold = 0.3;
};

// "top1", "top5", "cosine" (1 - cosine similarity to reference, lower is better), "sqnr" (dB vs
// reference), "top1_agreement" (fraction of argmax matching the reference);
// text recognition, from [n, T, classes] CTC probabilities and text labels, with options.keys_file:
// "ctc_exact" (fraction of lines decoded exactly), "ctc_char" (1 - PaddleOCR's normalized edit
// distance, averaged over lines), both ignoring spaces as PaddleOCR's RecMetric does, each giving
// the other in extra_values();
// detection: "mask_iou" (IoU of the probability > mask_threshold masks against the reference, mean
// over samples; extra_values() adds the minimum).
// Throws kInvalidArgument listing the known names for anything else, and for ctc_* without keys;
// kIo / kInvalidData for an unreadable or empty key file.
std::unique_ptr<Metric> make_metric(const std::string& name, const MetricOptions& options = {});
// The names make_metric knows, for help texts.
const char* known_metric_names();

}  // namespace slimquant::analysis
