#pragma once
// The PTQ analysis's histogram PDFs (seed 000): for the `num_histogram_plots` best and worst layers
// of a ranking, the distributions of their weights and of their input activations on the
// calibration data, with the chosen clipping thresholds drawn: best_weight_hist_result.pdf,
// best_act_hist_result.pdf, worst_weight_hist_result.pdf, worst_act_hist_result.pdf.
#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "slimquant/analysis/ptq_analysis.h"
#include "slimquant/core/tensor.h"
#include "slimquant/quant/ptq.h"

namespace slimquant::analysis {

// Calls `visit` once per calibration batch (graph inputs by name). Called twice (the activations'
// range, then their histograms), so it must give the same batches each time.
using CalibrationBatches =
    std::function<void(const std::function<void(const std::map<std::string, Tensor>& feeds)>& visit)>;

// Writes the four PDFs into save_dir for the `n` best and `n` worst layers of `report` that have a
// weight (weight PDFs) or an activation input (activation PDFs); returns their paths. `ptq` is the
// calibrated PTQ the report ranks.
std::vector<std::string> write_analysis_histograms(const quant::PTQ& ptq, const SensitivityReport& report,
                                                   const CalibrationBatches& for_each_batch, size_t n,
                                                   const std::string& save_dir);

}  // namespace slimquant::analysis
