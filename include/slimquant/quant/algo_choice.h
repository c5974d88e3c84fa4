#pragma once
// The activation observer chosen per model (algo "auto", the default). Which clipping rule keeps a
// model closest to FP32 depends on the model and its data: on PP-OCRv4 rec over hard text, KL kept
// 67.5% of characters where emd kept 63.0, while emd suits the fixtures. A fixed default is a
// guess, so the calibration observes with every candidate at once (observer.h, "auto"), and this
// measures each candidate's quantized model on samples held back from calibration: the output SQNR
// against FP32 (logits before a final Softmax), the highest wins. The result depends only on the
// model, the data and the configuration, so the same command chooses the same algorithm.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "slimquant/core/tensor.h"
#include "slimquant/quant/ptq.h"

namespace slimquant::quant {

struct ActivationAlgoChoice {
  std::string chosen;  // "" when no observer weighs candidates (an explicit algo)
  // Each candidate's output SQNR (dB) against FP32, in auto_algo_candidates() order.
  std::vector<std::pair<std::string, double>> sqnr_db;
  size_t samples = 0;      // samples each candidate ran
  bool held_back = false;  // the samples were not part of the calibration
  // "KL (output SQNR on 16 held-back samples: emd 31.2 dB, KL 33.0 dB, ...)"
  std::string describe() const;
};

// A candidate wins only by more than this (dB) over an earlier one in auto_algo_candidates():
// closer results are within what a few samples can tell apart, and then the earlier (emd) stays.
inline constexpr double kAlgoChoiceMarginDb = 0.1;

// How many samples the candidates are compared on after a calibration of `calibrated_samples`: all
// candidates together run at most as many samples as the calibration did, 1 to 16 each (a large
// network calibrated on 6 images compares on 1).
size_t algo_choice_samples(size_t calibrated_samples, size_t candidates);

// `ptq` calibrated with "auto" observers; `samples` graph inputs by name (rows = samples). Evaluates
// every candidate, selects the winner in `ptq` (PTQ::select_activation_algo) and returns what it
// measured. Nothing to do, and chosen empty, when ptq has no such observers.
ActivationAlgoChoice choose_activation_algo(PTQ& ptq, const std::map<std::string, Tensor>& samples, bool held_back);

}  // namespace slimquant::quant
