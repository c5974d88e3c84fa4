#pragma once
// Shared helpers for tests: fixture paths, temp dirs, running the CLI.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

namespace slimquant::test {

inline std::string source_path(const std::string& rel) { return std::string(SLIMQUANT_SOURCE_DIR) + "/" + rel; }
inline std::string fixture_model(const std::string& name) {
  return source_path("tests/fixtures/models/" + name + ".onnx");
}
// The `slimquant` tool under test: this build's, or SLIMQUANT_TEST_CLI (the sanitized run's own).
inline std::string cli_path() {
  const char* chosen = std::getenv("SLIMQUANT_TEST_CLI");
  // One literal, joined by the compiler: GCC 12 warns falsely (-Warray-bounds) on a string built here.
  return chosen && *chosen ? std::string(chosen) : std::string(SLIMQUANT_BINARY_DIR "/slimquant");
}

// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    path_ = std::filesystem::temp_directory_path() /
            ("slimquant_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string path(const std::string& rel = "") const { return rel.empty() ? path_.string() : (path_ / rel).string(); }

 private:
  static int& counter() {
    static int c = 0;
    return c;
  }
  std::filesystem::path path_;
};

struct CommandResult {
  int exit_code;
  std::string output;  // stdout and stderr together
};

// Runs a shell command and captures its output (stderr included) and exit code.
inline CommandResult run_command(const std::string& command) {
  const std::string cmd = command + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  CommandResult r{-1, ""};
  if (!pipe) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) r.output.append(buf, n);
  int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// The last line of a command's output that starts with '{', parsed (null when there is none): the
// --json line of a CLI command.
inline nlohmann::json last_json_line(const std::string& output) {
  std::istringstream in(output);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty() && line[0] == '{') last = line;
  return last.empty() ? nlohmann::json() : nlohmann::json::parse(last);
}

// A file's whole contents ("" when it cannot be read).
inline std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The page count poppler's pdfinfo reads from a PDF; -1 when it cannot read one.
inline int pdf_pages(const std::string& path) {
  const CommandResult info = run_command("pdfinfo '" + path + "'");
  const auto pos = info.output.find("Pages:");
  if (info.exit_code != 0 || pos == std::string::npos) return -1;
  return std::stoi(info.output.substr(pos + 6));
}

// Runs `slimquant ARGS` and captures its output and exit code.
inline CommandResult run_cli(const std::string& args, const std::string& env = "") {
  return run_command((env.empty() ? "" : env + " ") + cli_path() + " --quiet " + args);
}

}  // namespace slimquant::test
