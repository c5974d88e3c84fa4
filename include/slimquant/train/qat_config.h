#pragma once
// A QAT config file (docs/qat.md): the PTQ keys (algo, quantizable_op_type, skip lists, rules with
// act_quanter / weight_quanter, ...) read as quant::load_quant_config_yaml reads them, and the
// training keys below. A training key the file does not name stays unset, so the QATOptions
// defaults (or a command line's flags) apply.
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "slimquant/quant/quant_config.h"
#include "slimquant/train/qat.h"

namespace slimquant::train {

// The training keys of a QAT config file, by YAML key; unset when the file does not name it.
struct QATConfigKeys {
  std::optional<int> epochs;                 // epochs: 0..1000000
  std::optional<float> lr;                   // lr: > 0
  std::optional<size_t> batch_size;          // batch_size: >= 1
  std::optional<size_t> calib_batches;       // batch_nums
  std::optional<size_t> steps_per_epoch;     // steps_per_epoch
  std::optional<float> temperature;          // temperature: > 0
  std::optional<float> weight_decay;         // weight_decay: >= 0
  std::optional<float> momentum;             // momentum: >= 0
  std::optional<uint64_t> seed;              // seed
  std::optional<std::string> lr_schedule;    // lr_schedule
  std::optional<std::string> optimizer;      // optimizer
  std::optional<std::string> weight_quanter;  // weight_quanter (the default; rules may override)
  std::optional<std::string> act_quanter;     // act_quanter (the default; rules may override)
  std::optional<std::string> checkpoint;     // checkpoint
  std::optional<bool> nesterov;              // nesterov
  std::optional<bool> distill;               // distill

  // Sets the fields of `options` that the file names.
  void apply_to(QATOptions& options) const;
};

// The training keys among the flow keys quant::load_quant_config_yaml returns in `extra`; a value
// of the wrong type or out of range is kInvalidArgument naming the key.
QATConfigKeys qat_config_keys(const std::map<std::string, std::string>& extra);

struct QATConfigFile {
  quant::QuantConfig quant;
  QATConfigKeys training;
};

// Reads a QAT config file: kIo when it does not exist, kInvalidArgument naming the key for an
// unknown key or a bad value (as load_quant_config_yaml, then qat_config_keys).
QATConfigFile load_qat_config_yaml(const std::string& path, quant::QuantConfig base = quant::QuantConfig());

}  // namespace slimquant::train
