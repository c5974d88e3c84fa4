#include "slimquant/analysis/checkpoint.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "slimquant/core/error.h"

namespace slimquant::analysis {

void write_file_atomic(const std::string& path, const std::string& text) {
  namespace fs = std::filesystem;
  fs::path p(path);
  fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  SQ_CHECK(fs::is_directory(dir), ErrorKind::kIo, "cannot write '" + path + "': directory '" + dir.string() + "' does not exist");
  // The pid keeps two concurrent writers (a rerun while a killed run's file lingers) apart.
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    SQ_CHECK(out.good(), ErrorKind::kIo, "cannot write '" + path + "': '" + tmp + "' cannot be created (permissions?)");
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.flush();
    if (!out.good()) {
      std::remove(tmp.c_str());
      fail(ErrorKind::kIo, "cannot write '" + path + "': write failed (disk full?)");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail(ErrorKind::kIo, "cannot write '" + path + "': rename from the temporary file failed");
  }
}

std::string hash_hex(std::string_view bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

Checkpoint::Checkpoint(std::string path, nlohmann::json fingerprint)
    : path_(std::move(path)), fingerprint_(std::move(fingerprint)) {}

nlohmann::json Checkpoint::load() const {
  if (!std::filesystem::exists(path_)) return nullptr;
  std::ifstream in(path_, std::ios::binary);
  SQ_CHECK(in.good(), ErrorKind::kIo, "cannot read checkpoint '" + path_ + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(ss.str());
  } catch (const std::exception& e) {
    fail(ErrorKind::kInvalidData, "checkpoint '" + path_ + "' is not valid JSON (" + e.what() +
                                      "); delete it to start the analysis over");
  }
  SQ_CHECK(doc.is_object() && doc.contains("fingerprint") && doc.contains("state"), ErrorKind::kInvalidData,
           "checkpoint '" + path_ + "' is not a slimquant analysis checkpoint; delete it or choose another checkpoint name");
  const nlohmann::json& saved = doc["fingerprint"];
  if (saved != fingerprint_) {
    std::string diff;
    for (const auto& [key, value] : fingerprint_.items()) {
      if (saved.contains(key) && saved[key] == value) continue;
      diff += (diff.empty() ? "" : ", ") + key + " (checkpoint: " + (saved.contains(key) ? saved[key].dump() : "none") +
              ", now: " + value.dump() + ")";
    }
    if (diff.empty()) diff = "its entries";
    fail(ErrorKind::kInvalidArgument,
         "checkpoint '" + path_ + "' belongs to a different analysis: " + diff +
             " differ. Delete it, or pass another --checkpoint-name / --save-dir, to start over");
  }
  return doc["state"];
}

void Checkpoint::save(const nlohmann::json& state) const {
  nlohmann::json doc{{"format", "slimquant-analysis-checkpoint/1"}, {"fingerprint", fingerprint_}, {"state", state}};
  write_file_atomic(path_, doc.dump());
}

}  // namespace slimquant::analysis
