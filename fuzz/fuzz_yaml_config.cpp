// Fuzz target: bytes as a YAML config of quantize / qat / analyze (--config): the quantization
// keys, type/name/layer rules, the flow keys handed back to the commands, and validation.
#include <map>
#include <string>

#include "fuzz_util.h"
#include "slimquant/quant/quant_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace slimquant;
  fuzz::clear_scratch_dir();
  const auto path = fuzz::scratch_dir() / "config.yaml";
  fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  fuzz::expect_clean_errors([&] {
    std::map<std::string, std::string> extra;
    const quant::QuantConfig config = quant::load_quant_config_yaml(path.string(), quant::QuantConfig(), &extra);
    config.validate();
    (void)config.fingerprint();
  });
  return 0;
}
