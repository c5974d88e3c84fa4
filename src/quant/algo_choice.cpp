#include "slimquant/quant/algo_choice.h"

#include <algorithm>
#include <cstdio>

#include "slimquant/core/error.h"
#include "slimquant/core/progress.h"
#include "slimquant/quant/precision_fallback.h"
#include "slimquant/runtime/session.h"

namespace slimquant::quant {

std::string ActivationAlgoChoice::describe() const {
  std::string out = chosen + " (output SQNR on " + std::to_string(samples) + (held_back ? " held-back" : " calibration") +
                    (samples == 1 ? " sample: " : " samples: ");
  for (size_t i = 0; i < sqnr_db.size(); ++i) {
    char db[32];
    std::snprintf(db, sizeof db, "%.1f dB", sqnr_db[i].second);
    out += (i ? ", " : "") + sqnr_db[i].first + " " + db;
  }
  return out + ")";
}

size_t algo_choice_samples(size_t calibrated_samples, size_t candidates) {
  constexpr size_t kMostSamples = 16;
  return std::clamp<size_t>(calibrated_samples / std::max<size_t>(candidates, 1), 1, kMostSamples);
}

ActivationAlgoChoice choose_activation_algo(PTQ& ptq, const std::map<std::string, Tensor>& samples, bool held_back) {
  ActivationAlgoChoice choice;
  const std::vector<std::string> candidates = ptq.selectable_activation_algos();
  if (candidates.empty()) return choice;
  SQ_CHECK(!samples.empty(), ErrorKind::kInvalidArgument, "choose_activation_algo: no samples to compare on");
  const Tensor& first = samples.begin()->second;
  choice.samples = first.rank() == 0 ? 1 : static_cast<size_t>(first.dim(0));
  choice.held_back = held_back;

  runtime::SessionOptions so;
  so.num_threads = 0;
  runtime::RunOptions compared;
  compared.outputs = drift_measured_values(ptq.float_graph());
  const std::map<std::string, Tensor> reference = runtime::Session(ptq.float_graph(), so).run(samples, compared);
  Progress progress("choose algo", candidates.size(), "candidates");
  size_t best = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    ptq.select_activation_algo(candidates[i]);
    // The QDQ graph as exported, run by our runtime (integer execution equals it within rounding).
    runtime::Session session(ptq.convert(), so);
    choice.sqnr_db.push_back({candidates[i], output_sqnr_db(reference, session.run(samples, compared))});
    if (choice.sqnr_db[i].second > choice.sqnr_db[best].second + kAlgoChoiceMarginDb) best = i;
    progress.advance();
  }
  progress.finish();
  choice.chosen = candidates[best];
  ptq.select_activation_algo(choice.chosen);
  return choice;
}

}  // namespace slimquant::quant
