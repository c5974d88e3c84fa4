#include "slimquant/quant/precision_fallback.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "slimquant/core/error.h"
#include "slimquant/core/progress.h"
#include "slimquant/runtime/session.h"

namespace slimquant::quant {

double output_sqnr_db(const std::map<std::string, Tensor>& reference, const std::map<std::string, Tensor>& quantized) {
  double signal = 0, noise = 0;
  for (const auto& [name, r] : reference) {
    auto it = quantized.find(name);
    if (it == quantized.end() || r.dtype() != DType::kFloat32 || it->second.dtype() != DType::kFloat32 ||
        r.shape() != it->second.shape())
      continue;
    const float* a = r.data<float>();
    const float* b = it->second.data<float>();
    for (int64_t i = 0; i < r.numel(); ++i) {
      signal += static_cast<double>(a[i]) * a[i];
      const double d = static_cast<double>(a[i]) - b[i];
      noise += d * d;
    }
  }
  if (noise == 0) return 200.0;  // identical: the cap the analysis reports for FP32 itself
  if (signal == 0) return -200.0;
  return std::min(200.0, 10.0 * std::log10(signal / noise));
}

std::set<std::string> PrecisionFallbackResult::quantized_layers(const PTQ& ptq) const {
  std::set<std::string> out;
  for (const auto& l : ptq.layers())
    if (std::find(float_layers.begin(), float_layers.end(), l.name) == float_layers.end()) out.insert(l.name);
  return out;
}

namespace {
// The values whose drift is measured: the graph outputs, except that an output written by Softmax
// / LogSoftmax is measured before it. Probabilities near 0 and 1 hide the logit errors that change
// a decision (PP-OCRv4 rec: two fallback choices of equal probability SQNR differed by 8 points of
// exact match).
std::vector<std::string> compared_values(const ir::Graph& g) {
  std::vector<std::string> values;
  for (const auto& out : g.outputs) {
    const int p = g.producer(out.name);
    const bool softmax = p >= 0 && (g.nodes[static_cast<size_t>(p)].op_type == "Softmax" ||
                                    g.nodes[static_cast<size_t>(p)].op_type == "LogSoftmax");
    values.push_back(softmax ? g.nodes[static_cast<size_t>(p)].input(0) : out.name);
  }
  return values;
}
}  // namespace

PrecisionFallbackResult choose_precision_fallback(PTQ& ptq, const std::map<std::string, Tensor>& samples,
                                                  const PrecisionFallbackOptions& options) {
  PrecisionFallbackResult result;
  const auto& layers = ptq.layers();
  if (options.target_sqnr_db <= 0 || layers.empty()) return result;
  runtime::SessionOptions so;
  so.num_threads = 0;
  runtime::RunOptions compared;
  compared.outputs = compared_values(ptq.float_graph());
  const std::map<std::string, Tensor> reference = runtime::Session(ptq.float_graph(), so).run(samples, compared);
  auto sqnr_without = [&](const std::vector<std::string>& in_float) {
    PrecisionFallbackResult r;
    r.float_layers = in_float;
    ++result.evaluations;
    // Float simulation of the QDQ graph: the integer execution equals it within rounding.
    runtime::Session session(ptq.convert(r.quantized_layers(ptq)), so);
    return output_sqnr_db(reference, session.run(samples, compared));
  };
  result.sqnr_db_before = result.sqnr_db_after = sqnr_without({});
  if (result.sqnr_db_before >= options.target_sqnr_db) return result;
  result.triggered = true;
  result.sqnr_db_per_tensor = result.sqnr_db_before;
  if (!ptq.channel_abs_max().empty() && !ptq.channel_wise_conv_inputs()) {
    ptq.set_channel_wise_conv_inputs(true);
    const double channel_wise = sqnr_without({});
    if (channel_wise > result.sqnr_db_before) {
      result.channel_wise_conv_inputs = true;
      result.sqnr_db_before = result.sqnr_db_after = channel_wise;
      if (channel_wise >= options.target_sqnr_db) return result;
    } else {
      ptq.set_channel_wise_conv_inputs(false);
    }
  }

  // Rank: the output SQNR with each layer alone quantized, most damaging first. Leave-one-out
  // ranking (each layer alone in float) finds only the single worst layer on a model whose errors
  // compound: with everything else quantized, one more float layer barely moves the output
  // (PP-OCRv4 rec: it chose one layer, 80.5 exact; this ranking's five layers: within a point of FP32).
  std::vector<std::pair<double, std::string>> damage;
  Progress progress("fallback", layers.size(), "layers");
  for (const auto& l : layers) {
    PrecisionFallbackResult only;
    for (const auto& other : layers)
      if (other.name != l.name) only.float_layers.push_back(other.name);
    ++result.evaluations;
    runtime::Session session(ptq.convert(only.quantized_layers(ptq)), so);
    damage.push_back({output_sqnr_db(reference, session.run(samples, compared)), l.name});
    progress.advance();
  }
  progress.finish();
  std::stable_sort(damage.begin(), damage.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  const auto budget = static_cast<size_t>(std::ceil(options.max_float_fraction * static_cast<double>(layers.size())));
  std::vector<std::string> chosen;
  double best = result.sqnr_db_before;
  for (size_t k = 0; k < std::min(budget, damage.size()); ++k) {
    chosen.push_back(damage[k].second);
    const double s = sqnr_without(chosen);
    if (s > best) {
      best = s;
      result.float_layers = chosen;
    }
    if (best >= options.target_sqnr_db) break;
  }
  result.sqnr_db_after = best;
  return result;
}

}  // namespace slimquant::quant
