#pragma once
// Analysis checkpoints: a JSON document tagged with a fingerprint of everything that determines the
// result (model, quantization config, calibrated scales, metric, data, batch size). Saved
// atomically (temp file + rename in the same directory), so a crash at any moment leaves either the
// previous or the new checkpoint, never a torn one.
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace slimquant::analysis {

// Writes `text` to `path` through a temporary file in the same directory and a rename. Throws kIo
// naming the path when the directory is missing or unwritable.
void write_file_atomic(const std::string& path, const std::string& text);

// 64-bit FNV-1a of the bytes, as 16 hex digits (fingerprints, not security).
std::string hash_hex(std::string_view bytes);

class Checkpoint {
 public:
  Checkpoint(std::string path, nlohmann::json fingerprint);
  // The saved state, or null when no checkpoint file exists. Throws kInvalidArgument when the file
  // belongs to another analysis (naming the fingerprint entries that differ, and how to start over),
  // kInvalidData when it cannot be parsed.
  nlohmann::json load() const;
  void save(const nlohmann::json& state) const;
  const std::string& path() const { return path_; }
  const nlohmann::json& fingerprint() const { return fingerprint_; }

 private:
  std::string path_;
  nlohmann::json fingerprint_;
};

}  // namespace slimquant::analysis
