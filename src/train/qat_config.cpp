// QAT config files: the PTQ loader's keys plus the training keys, each checked like its flag.
#include "slimquant/train/qat_config.h"

namespace slimquant::train {

namespace {

// The value of `key` in a config file's flow keys, when the file names it (and it is not empty).
const std::string* find_key(const std::map<std::string, std::string>& extra, const char* key) {
  const auto it = extra.find(key);
  return it == extra.end() || it->second.empty() ? nullptr : &it->second;
}

std::optional<size_t> size_key(const std::map<std::string, std::string>& extra, const char* key) {
  const std::string* v = find_key(extra, key);
  if (!v) return std::nullopt;
  return quant::parse_config_size(*v, key);
}

std::optional<size_t> positive_key(const std::map<std::string, std::string>& extra, const char* key) {
  const std::optional<size_t> v = size_key(extra, key);
  SQ_CHECK(!v || *v > 0, ErrorKind::kInvalidArgument, std::string("config key '") + key + "' must be at least 1");
  return v;
}

// A finite number above `lo` (or at least `lo` when inclusive).
std::optional<float> number_key(const std::map<std::string, std::string>& extra, const char* key, double lo,
                                bool inclusive) {
  const std::string* text = find_key(extra, key);
  if (!text) return std::nullopt;
  const double v = quant::parse_config_double(*text, key);
  SQ_CHECK(inclusive ? v >= lo : v > lo, ErrorKind::kInvalidArgument,
           std::string("config key '") + key + "' must be " + (inclusive ? "at least " : "greater than ") +
               std::to_string(lo) + ", got '" + *text + "'");
  return static_cast<float>(v);
}

std::optional<std::string> string_key(const std::map<std::string, std::string>& extra, const char* key) {
  const std::string* v = find_key(extra, key);
  return v ? std::optional<std::string>(*v) : std::nullopt;
}

std::optional<bool> bool_key(const std::map<std::string, std::string>& extra, const char* key) {
  const std::string* v = find_key(extra, key);
  if (!v) return std::nullopt;
  return quant::parse_config_bool(*v, key);
}

template <class T>
void set_if(const std::optional<T>& value, T& field) {
  if (value) field = *value;
}

}  // namespace

QATConfigKeys qat_config_keys(const std::map<std::string, std::string>& extra) {
  QATConfigKeys k;
  if (const std::optional<size_t> epochs = size_key(extra, "epochs")) {
    SQ_CHECK(*epochs <= 1000000, ErrorKind::kInvalidArgument, "config key 'epochs' is too large");
    k.epochs = static_cast<int>(*epochs);
  }
  k.lr = number_key(extra, "lr", 0, false);
  k.batch_size = positive_key(extra, "batch_size");
  k.calib_batches = size_key(extra, "batch_nums");
  k.temperature = number_key(extra, "temperature", 0, false);
  k.steps_per_epoch = size_key(extra, "steps_per_epoch");
  k.weight_decay = number_key(extra, "weight_decay", 0, true);
  k.momentum = number_key(extra, "momentum", 0, true);
  if (const std::optional<size_t> seed = size_key(extra, "seed")) k.seed = *seed;
  k.lr_schedule = string_key(extra, "lr_schedule");
  k.nesterov = bool_key(extra, "nesterov");
  k.checkpoint = string_key(extra, "checkpoint");
  k.optimizer = string_key(extra, "optimizer");
  k.weight_quanter = string_key(extra, "weight_quanter");
  k.act_quanter = string_key(extra, "act_quanter");
  k.distill = bool_key(extra, "distill");
  return k;
}

void QATConfigKeys::apply_to(QATOptions& o) const {
  set_if(epochs, o.epochs);
  set_if(lr, o.lr);
  set_if(batch_size, o.batch_size);
  set_if(calib_batches, o.calib_batches);
  set_if(steps_per_epoch, o.steps_per_epoch);
  set_if(temperature, o.temperature);
  set_if(weight_decay, o.optimizer.weight_decay);
  set_if(momentum, o.optimizer.momentum);
  set_if(seed, o.seed);
  set_if(lr_schedule, o.lr_schedule);
  set_if(optimizer, o.optimizer.type);
  set_if(weight_quanter, o.weight_quanter);
  set_if(act_quanter, o.act_quanter);
  set_if(checkpoint, o.checkpoint);
  set_if(nesterov, o.optimizer.nesterov);
  set_if(distill, o.distill);
}

QATConfigFile load_qat_config_yaml(const std::string& path, quant::QuantConfig base) {
  std::map<std::string, std::string> extra;
  QATConfigFile file;
  file.quant = quant::load_quant_config_yaml(path, std::move(base), &extra);
  file.training = qat_config_keys(extra);
  return file;
}

}  // namespace slimquant::train
