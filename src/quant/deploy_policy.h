#pragma once
// What differs between the runtimes an export is shaped for (QuantConfig::deploy_backend): one
// policy object per backend, so that placement (QuantConfig::spec_for, PTQ::quantize) and export
// (PTQ::convert) ask the backend instead of testing its name. docs/quantization.md describes the
// three forms.
#include <string>
#include <vector>

#include "quant/qdq_export.h"
#include "slimquant/quant/observer.h"
#include "slimquant/quant/quant_config.h"

namespace slimquant::quant {

class DeployPolicy {
 public:
  virtual ~DeployPolicy() = default;
  static const DeployPolicy& of(DeployBackend backend);

  // Whether a node with a quantization spec is quantized: `listed` when its op type is in
  // quantizable_op_type. Skips and rules are applied after this.
  virtual bool quantizes(const ir::Node& node, const OpQuantSpec& spec, bool listed, bool full_quantize) const = 0;
  // The activation inputs of `node` to quantize, given those its spec names.
  virtual std::vector<int> activation_inputs(const ir::Graph& g, const QuantConfig& config, const ir::Node& node,
                                             std::vector<int> from_spec) const {
    (void)g, (void)config, (void)node;
    return from_spec;
  }
  // The activation grid: `observer_default` is the observer's own choice.
  virtual QuantScheme activation_scheme(QuantScheme observer_default, bool asymmetric_activations) const = 0;
  // Whether a quantized Softmax output gets the fixed u8 grid 1/256 (the backend's integer Softmax
  // needs it) instead of its calibrated range.
  virtual bool fixed_softmax_grid() const { return true; }
  // Whether a Conv output that all its readers read as codes (a squeeze-excitation block's pool and
  // gating) is quantized for all of them, so that the runtime reads it once as codes (PTQ::quantize).
  virtual bool quantizes_code_readable_inputs() const { return false; }
  // Whether the convolution input x of the written QDQ graph may get per-channel scales (precision
  // recovery's first remedy).
  virtual bool allows_channel_wise_conv_input(const ir::Graph& qdq, const std::string& x) const {
    (void)qdq, (void)x;
    return false;
  }
  // How the QDQ writer spells biases and weight zero points.
  virtual QdqExportOptions export_options() const = 0;
  // Backend-specific rewriting of the written QDQ graph.
  virtual void finish_export(ir::Graph& qdq) const { (void)qdq; }
};

}  // namespace slimquant::quant
