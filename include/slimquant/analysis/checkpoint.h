#pragma once
// Analysis checkpoints: a JSON document tagged with a fingerprint of everything that determines the
// result (model, quantization config, calibrated scales, metric, data, batch size). Saved
// atomically (temp file + rename in the same directory), so a crash at any moment leaves either the
// previous or the new checkpoint, never a torn one. A CRC-32 over fingerprint and state catches
// corrupted or edited files on resume.
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace slimquant::analysis {

// Writes `text` to `path` through a temporary file in the same directory and a rename. Throws kIo
// naming the path when the directory is missing or unwritable.
void write_file_atomic(const std::string& path, const std::string& text);

// CRC-32 (zlib's) of the bytes: checkpoint checksums.
uint32_t crc32(std::string_view bytes);

// An exclusive lock on a directory (flock on DIR/.slimquant.lock, holding the owner's pid) for as
// long as the object lives, so two analyses never write into one save_dir at the same time.
// Throws kIo naming the directory and the holder: another process (its pid), or this process (an
// analysis still running in it, e.g. from another thread or from inside an eval_function).
// Released explicitly on destruction, so a child forked meanwhile (a data loader's worker) that
// inherited the descriptor does not keep holding it.
class DirectoryLock {
 public:
  DirectoryLock(const std::string& dir, const std::string& what);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

 private:
  int fd_ = -1;
};

// 64-bit FNV-1a of the bytes, as 16 hex digits (fingerprints, not security).
std::string hash_hex(std::string_view bytes);

class Checkpoint {
 public:
  Checkpoint(std::string path, nlohmann::json fingerprint);
  // The saved state, or null when no checkpoint file exists. Throws kInvalidArgument when the file
  // belongs to another analysis (naming the fingerprint entries that differ, and how to start over),
  // kInvalidData when it cannot be parsed or fails its CRC-32 checksum (corrupted or edited).
  nlohmann::json load() const;
  void save(const nlohmann::json& state) const;
  const std::string& path() const { return path_; }
  const nlohmann::json& fingerprint() const { return fingerprint_; }
  static uint32_t checksum(const nlohmann::json& fingerprint, const nlohmann::json& state);

 private:
  std::string path_;
  nlohmann::json fingerprint_;
};

}  // namespace slimquant::analysis
