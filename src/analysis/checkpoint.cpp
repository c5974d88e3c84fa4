#include "slimquant/analysis/checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "slimquant/core/atomic_file.h"
#include "slimquant/core/error.h"

namespace slimquant::analysis {

void write_file_atomic(const std::string& path, const std::string& text) {
  namespace fs = std::filesystem;
  fs::path p(path);
  fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  SQ_CHECK(fs::is_directory(dir), ErrorKind::kIo, "cannot write '" + path + "': directory '" + dir.string() + "' does not exist");
  slimquant::write_file_atomic(path, text);  // one writer: unique temporaries, never renames over special files
}

uint32_t crc32(std::string_view bytes) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  while (!bytes.empty()) {  // zlib takes uInt lengths
    const uInt chunk = static_cast<uInt>(std::min<size_t>(bytes.size(), 1u << 30));
    crc = ::crc32(crc, reinterpret_cast<const Bytef*>(bytes.data()), chunk);
    bytes.remove_prefix(chunk);
  }
  return static_cast<uint32_t>(crc);
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

uint32_t Checkpoint::checksum(const nlohmann::json& fingerprint, const nlohmann::json& state) {
  // Over the serialised values: dump() is canonical (sorted keys, round-trip numbers), so the
  // same values give the same text after a save and a load.
  return crc32(fingerprint.dump() + '\n' + state.dump());
}

DirectoryLock::DirectoryLock(const std::string& dir, const std::string& what) {
  const std::string path = (std::filesystem::path(dir) / ".slimquant.lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  SQ_CHECK(fd_ >= 0, ErrorKind::kIo, "cannot create the lock file '" + path + "': " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
    ::close(fd_);
    fd_ = -1;
    std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    if (err == EWOULDBLOCK && holder == std::to_string(::getpid()))
      fail(ErrorKind::kIo, what + " '" + dir + "' is in use by this process (pid " + holder +
                               "): an analysis into it is still running here (in another thread, or the one whose "
                               "eval_function started this one); let it finish first, or choose another " + what);
    if (err == EWOULDBLOCK)
      fail(ErrorKind::kIo, what + " '" + dir + "' is in use by another slimquant process" +
                               (holder.empty() ? std::string() : " (pid " + holder + ")") +
                               ": wait for it to finish, or choose another " + what);
    fail(ErrorKind::kIo, "cannot lock '" + path + "': " + std::strerror(err));
  }
  // Who holds it, for the message another process prints.
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, pid.data(), pid.size(), 0) < 0) {
    // Only informational: the lock itself is what matters.
  }
}

DirectoryLock::~DirectoryLock() {
  if (fd_ < 0) return;
  // Unlocked explicitly: closing releases the flock only when no other descriptor shares it, and a
  // child forked meanwhile (a data loader's worker, a subprocess pool) holds a copy of this one; it
  // would keep the directory locked, under this process's pid, after the analysis has finished.
  ::flock(fd_, LOCK_UN);
  ::close(fd_);
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
  SQ_CHECK(doc.contains("crc32") && doc["crc32"].is_number_unsigned(), ErrorKind::kInvalidData,
           "checkpoint '" + path_ + "' has no checksum (written by an older slimquant, or edited): delete it to start "
           "the analysis over");
  SQ_CHECK(doc["crc32"].get<uint32_t>() == checksum(doc["fingerprint"], doc["state"]), ErrorKind::kInvalidData,
           "checkpoint '" + path_ + "' is corrupted: it fails its CRC-32 check; delete it to start the analysis over");
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
  nlohmann::json doc{{"format", "slimquant-analysis-checkpoint/2"},
                     {"fingerprint", fingerprint_},
                     {"state", state},
                     {"crc32", checksum(fingerprint_, state)}};
  write_file_atomic(path_, doc.dump());
}

}  // namespace slimquant::analysis
