#pragma once
// Statistics mode of the PTQ analysis: no metric, no evaluation function; per quantizable layer,
// how far quantization moves its weights, its input activations and its output.
//
// Per layer (rows in the order of PTQ::layers(), which is topological):
//   weight      FP32 vs quantized (dequantized, scale * q, as the QDQ graph computes it)
//               min / max / mean / std, and the weight SQNR;
//   activation  the layer's input activation(s) on the data: FP32 vs fake-quantized with the
//               layer's activation parameters (dequantize(quantize(x)) as its QuantizeLinear /
//               DequantizeLinear pair computes it), min / max / mean / std and SQNR; a layer with
//               several activation inputs (MatMul of two activations) pools them;
//   isolated    SQNR of the layer's output in the graph where only this layer is quantized
//               (PTQ::convert({layer})), fed with the FP32 model's inputs of the layer: the error
//               this layer adds on its own;
//   accumulated SQNR of the layer's output in the fully quantized graph (PTQ::convert()) run on the
//               data. A layer's output depends only on the layers upstream of it, so this is the
//               graph "with every layer up to and including this one quantized" — with scales as
//               the deployed model shares them (a Concat group's range comes from the whole
//               model), i.e. exactly the error the shipped model carries at that point.
// SQNR (dB) = 10 log10(sum x^2 / sum (x - x_q)^2) with both sums over all data (not per-batch
// averages); +inf when the two agree exactly (CSV "inf", JSON null).
#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

#include "slimquant/data/dataset.h"
#include "slimquant/quant/ptq.h"

namespace slimquant::analysis {

struct StatisticsOptions {
  size_t batch_size = 64;
  size_t max_batches = 0;  // 0 = all
};

// Per layer of ptq (already calibrated): FP32 vs quantized min/max/mean/std of weights and input
// activations, SQNR (dB) of the layer output isolated (only this layer quantized) and accumulated
// (all layers up to and including it quantized). Writes statistics.csv and statistics.json into
// save_dir (created if missing; both written atomically); returns the JSON.
// Throws kInvalidArgument for a model with more than one input or batch_size 0, kInvalidData for
// an empty data set or an uncalibrated PTQ, kIo when save_dir cannot be written.
nlohmann::json run_layer_statistics(const quant::PTQ& ptq, const data::Dataset& data, const std::string& save_dir,
                                    const StatisticsOptions& options = {});

}  // namespace slimquant::analysis
