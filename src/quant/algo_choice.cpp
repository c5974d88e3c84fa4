#include "slimquant/quant/algo_choice.h"

#include <algorithm>
#include <cstdio>

#include "slimquant/core/error.h"
#include "slimquant/core/progress.h"
#include "slimquant/quant/precision_fallback.h"
#include "slimquant/runtime/session.h"

namespace slimquant::quant {

namespace {

// A class-score output: the Softmax / LogSoftmax result behind a graph output, and its class axis.
struct DecisionOutput {
  std::string name;
  int64_t axis = -1;
  bool coerced = false;  // opset < 13: the classes are every dimension from `axis` on
};

std::vector<DecisionOutput> decision_outputs(const ir::Graph& g) {
  std::vector<DecisionOutput> out;
  for (const auto& o : g.outputs)
    if (const ir::Node* n = softmax_writing(g, o.name))  // its own result: Reshape keeps the argmax of each row
      out.push_back({n->outputs[0], n->attr_int("axis", g.opset >= 13 ? -1 : 1), g.opset < 13});
  return out;
}

// (positions whose argmax along the class axis agrees, positions).
std::pair<int64_t, int64_t> agreeing_decisions(const Tensor& reference, const Tensor& quantized, const DecisionOutput& d) {
  if (reference.dtype() != DType::kFloat32 || quantized.dtype() != DType::kFloat32 ||
      reference.shape() != quantized.shape() || reference.rank() == 0)
    return {0, 0};
  const int64_t rank = reference.rank();
  const int64_t axis = d.axis < 0 ? d.axis + rank : d.axis;
  if (axis < 0 || axis >= rank) return {0, 0};
  int64_t outer = 1, classes = 1, inner = 1;
  for (int64_t i = 0; i < rank; ++i) (i < axis ? outer : i == axis || d.coerced ? classes : inner) *= reference.dim(i);
  if (classes < 2) return {0, 0};
  const float* a = reference.data<float>();
  const float* b = quantized.data<float>();
  int64_t same = 0;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const int64_t base = o * classes * inner + i;
      int64_t best_a = 0, best_b = 0;
      for (int64_t c = 1; c < classes; ++c) {
        if (a[base + c * inner] > a[base + best_a * inner]) best_a = c;
        if (b[base + c * inner] > b[base + best_b * inner]) best_b = c;
      }
      same += best_a == best_b;
    }
  return {same, outer * inner};
}

// Whether `challenger` beats `leader`, an earlier candidate (see kAlgoChoiceMarginDb).
bool beats(const AlgoCandidateScore& challenger, const AlgoCandidateScore& leader) {
  if (challenger.agreement != leader.agreement) return challenger.agreement > leader.agreement;
  return challenger.sqnr_db > leader.sqnr_db + kAlgoChoiceMarginDb;
}

}  // namespace

std::string ActivationAlgoChoice::describe() const {
  const bool decisions = !scores.empty() && scores.front().agreement >= 0;
  std::string out = chosen + (channel_wise_conv_inputs ? " with per-channel convolution inputs" : "") + " (on " +
                    std::to_string(samples) + (held_back ? " held-back" : " calibration") +
                    (samples == 1 ? " sample, " : " samples, ") +
                    (decisions ? "class decisions equal to FP32 / output SQNR: " : "output SQNR against FP32: ");
  for (size_t i = 0; i < scores.size(); ++i) {
    char text[64];
    if (decisions)
      std::snprintf(text, sizeof text, "%.1f%% %.1f dB", 100.0 * scores[i].agreement, scores[i].sqnr_db);
    else
      std::snprintf(text, sizeof text, "%.1f dB", scores[i].sqnr_db);
    out += (i ? ", " : "") + scores[i].algo + (scores[i].channel_wise_conv_inputs ? " per-channel " : " ") + text;
  }
  return out + ")";
}

size_t algo_choice_samples(size_t calibrated_samples, size_t candidates) {
  constexpr size_t kMostSamples = 16;
  return std::clamp<size_t>(calibrated_samples / std::max<size_t>(candidates, 1), 1, kMostSamples);
}

ActivationAlgoChoice choose_activation_algo(PTQ& ptq, const std::map<std::string, Tensor>& samples, bool held_back,
                                            const AlgoChoiceOptions& options) {
  ActivationAlgoChoice choice;
  const std::vector<std::string> candidates = ptq.selectable_activation_algos();
  if (candidates.empty()) return choice;
  SQ_CHECK(!samples.empty(), ErrorKind::kInvalidArgument, "choose_activation_algo: no samples to compare on");
  choice.samples = static_cast<size_t>(
      std::max<int64_t>(1, runtime::batch_rows(samples, runtime::input_batch_axes(ptq.float_graph().inputs))));
  choice.held_back = held_back;

  const ir::Graph& float_graph = ptq.float_graph();
  const std::vector<DecisionOutput> decisions = decision_outputs(float_graph);
  runtime::SessionOptions so;
  so.num_threads = 0;
  runtime::RunOptions compared;
  const std::vector<std::string> drift_values = drift_measured_values(float_graph);
  compared.outputs = drift_values;
  for (const auto& d : decisions) compared.outputs.push_back(d.name);
  const std::map<std::string, Tensor> reference = runtime::Session(float_graph, so).run(samples, compared);
  std::map<std::string, Tensor> reference_drift;  // without the Softmax outputs, as the recovery measures
  for (const auto& name : drift_values) reference_drift[name] = reference.at(name);

  const bool channel_wise_possible = options.channel_wise_below_sqnr_db > 0 && !ptq.channel_abs_max().empty() &&
                                     !ptq.channel_wise_conv_inputs();
  const size_t passes = channel_wise_possible ? 2 : 1;
  Progress progress("choose algo", passes * candidates.size(), "candidates");
  auto evaluate = [&](const std::string& algo) {
    ptq.select_activation_algo(algo);
    AlgoCandidateScore score{algo, ptq.channel_wise_conv_inputs()};
    // The QDQ graph as exported, run by our runtime (integer execution equals it within rounding).
    std::map<std::string, Tensor> out = runtime::Session(ptq.convert(), so).run(samples, compared);
    int64_t same = 0, positions = 0;
    for (const auto& d : decisions) {
      const auto [agree, total] = agreeing_decisions(reference.at(d.name), out.at(d.name), d);
      same += agree;
      positions += total;
    }
    if (positions > 0) score.agreement = static_cast<double>(same) / static_cast<double>(positions);
    score.sqnr_db = output_sqnr_db(reference_drift, out);
    choice.scores.push_back(score);
    progress.advance();
  };
  for (const auto& algo : candidates) evaluate(algo);
  double best_sqnr = choice.scores.front().sqnr_db;
  for (const auto& s : choice.scores) best_sqnr = std::max(best_sqnr, s.sqnr_db);
  if (channel_wise_possible && best_sqnr < options.channel_wise_below_sqnr_db) {
    ptq.set_channel_wise_conv_inputs(true);
    for (const auto& algo : candidates) evaluate(algo);
  }
  progress.finish();
  size_t best = 0;
  for (size_t i = 1; i < choice.scores.size(); ++i)
    if (beats(choice.scores[i], choice.scores[best])) best = i;
  choice.chosen = choice.scores[best].algo;
  choice.channel_wise_conv_inputs = choice.scores[best].channel_wise_conv_inputs && !choice.scores.front().channel_wise_conv_inputs;
  ptq.set_channel_wise_conv_inputs(choice.scores[best].channel_wise_conv_inputs);
  ptq.select_activation_algo(choice.chosen);
  return choice;
}

}  // namespace slimquant::quant
