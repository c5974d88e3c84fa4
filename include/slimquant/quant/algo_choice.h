#pragma once
// The activation observer chosen per model (algo "auto", the default). Which clipping rule keeps a
// model closest to FP32 depends on the model and its data: on PP-OCRv4 rec over lines of random
// characters, mse lost 0.7 char points where emd lost 1.7 and hist and KL 1.4, while emd suits the
// fixtures. A fixed default is a guess, so the calibration observes with every candidate at once
// (observer.h, "auto"), and this measures each candidate's quantized model on samples held back
// from calibration against FP32:
// - where an output comes from Softmax / LogSoftmax (class scores), by the decisions: the share of
//   positions whose argmax along the softmax axis equals FP32's (output SQNR breaks ties). SQNR
//   alone ranked hist first there, 0.2 dB ahead of mse, and mse kept 0.7 char points more;
// - otherwise by the output SQNR.
// A model that drifts below the precision recovery's target is also measured with per-channel
// convolution inputs (PTQ::set_channel_wise_conv_inputs, the recovery's first remedy): the choice
// is made on the model as it will be exported. The result depends only on the model, the data and
// the configuration, so the same command chooses the same algorithm.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "slimquant/core/tensor.h"
#include "slimquant/quant/ptq.h"

namespace slimquant::quant {

struct AlgoCandidateScore {
  std::string algo;
  bool channel_wise_conv_inputs = false;
  double sqnr_db = 0;       // output SQNR against FP32
  double agreement = -1;    // share of class decisions equal to FP32's; -1: no Softmax output
};

struct ActivationAlgoChoice {
  std::string chosen;  // "" when no observer weighs candidates (an explicit algo)
  bool channel_wise_conv_inputs = false;  // the choice turned per-channel convolution inputs on
  // Each evaluated candidate, in auto_algo_candidates() order, per-tensor inputs first.
  std::vector<AlgoCandidateScore> scores;
  size_t samples = 0;      // samples each candidate ran
  bool held_back = false;  // the samples were not part of the calibration
  // "mse (on 16 held-back samples, decisions equal to FP32 / output SQNR: emd 96.6% 14.3 dB, ...)"
  std::string describe() const;
};

// A later candidate in auto_algo_candidates() wins only with more equal decisions, or as many and
// more than this much output SQNR (dB): closer results are within what a few samples can tell
// apart, and then the earlier (emd first) stays.
inline constexpr double kAlgoChoiceMarginDb = 0.1;

struct AlgoChoiceOptions {
  // Below this output SQNR (dB) for every candidate, the candidates are measured again with
  // per-channel convolution inputs (the precision recovery's target; 0: never).
  double channel_wise_below_sqnr_db = 0;
};

// How many samples the candidates are compared on after a calibration of `calibrated_samples`: all
// candidates together run at most as many samples as the calibration did, 1 to 16 each (a large
// network calibrated on 6 images compares on 1).
size_t algo_choice_samples(size_t calibrated_samples, size_t candidates);

// `ptq` calibrated with "auto" observers; `samples` graph inputs by name (rows = samples). Evaluates
// every candidate, selects the winner in `ptq` (PTQ::select_activation_algo) and returns what it
// measured. Nothing to do, and chosen empty, when ptq has no such observers.
// With per-channel convolution inputs chosen, `ptq` is left with them on.
ActivationAlgoChoice choose_activation_algo(PTQ& ptq, const std::map<std::string, Tensor>& samples, bool held_back,
                                            const AlgoChoiceOptions& options = {});

}  // namespace slimquant::quant
