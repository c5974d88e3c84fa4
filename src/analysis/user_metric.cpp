#include "slimquant/analysis/user_metric.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "slimquant/core/error.h"
#include "slimquant/ir/onnx_io.h"

namespace slimquant::analysis {

namespace {

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string last_line(const std::string& output) {
  std::istringstream in(output);
  std::string line, last;
  while (std::getline(in, line)) {
    const size_t end = line.find_last_not_of(" \t\r");
    if (end != std::string::npos) last = line.substr(0, end + 1);
  }
  const size_t begin = last.find_first_not_of(" \t");
  return begin == std::string::npos ? std::string() : last.substr(begin);
}

// A directory that exists only while a candidate is evaluated: the command's model file and
// anything the model needs next to it.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& parent) {
    static std::atomic<unsigned> counter{0};
    const std::filesystem::path base = parent.empty() ? std::filesystem::temp_directory_path() : std::filesystem::path(parent);
    path_ = base / ("slimquant-eval-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
    std::filesystem::create_directories(path_, ec);
    SQ_CHECK(!ec, ErrorKind::kIo, "cannot create the evaluation directory '" + path_.string() + "': " + ec.message());
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

double run_command_on(const CommandMetricOptions& o, const ir::Graph& model) {
  ScratchDir dir(o.temp_dir);
  const std::string model_path = (dir.path() / "candidate.onnx").string();
  ir::save_onnx(model, model_path);
  return run_metric_command(o, model_path);
}

}  // namespace

double run_metric_command(const CommandMetricOptions& o, const std::string& model_path) {
  const std::string command = substitute_model_path(o.command, model_path);
  std::fflush(stdout);  // the command's stderr and ours interleave in order
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  SQ_CHECK(pipe != nullptr, ErrorKind::kIo, "cannot start --eval-command '" + o.command + "': " + std::strerror(errno));
  std::string output;
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof buffer, pipe.get())) output.append(buffer, n);
  const int status = pclose(pipe.release());
  const std::string tail = last_line(output);
  const std::string shown = tail.empty() ? "no output" : "last line: '" + tail.substr(0, 200) + "'";
  SQ_CHECK(status != -1, ErrorKind::kIo, "--eval-command '" + o.command + "': cannot get its exit status");
  SQ_CHECK(!WIFSIGNALED(status), ErrorKind::kInvalidArgument,
           "--eval-command '" + o.command + "' was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + shown + ")");
  SQ_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, ErrorKind::kInvalidArgument,
           "--eval-command '" + o.command + "' failed with exit code " + std::to_string(WEXITSTATUS(status)) + " (" +
               shown + ")");
  return parse_metric_output(output, o.key, o.command);
}

std::string substitute_model_path(const std::string& text, const std::string& path) {
  static const std::string kPlaceholder = "{model}";
  std::string out;
  size_t from = 0;
  for (size_t at; (at = text.find(kPlaceholder, from)) != std::string::npos; from = at + kPlaceholder.size())
    out += text.substr(from, at - from) + shell_quote(path);
  return out + text.substr(from);
}

double parse_metric_output(const std::string& output, const std::string& key, const std::string& command) {
  const std::string line = last_line(output);
  const std::string where = "--eval-command '" + command + "'";
  SQ_CHECK(!line.empty(), ErrorKind::kInvalidArgument,
           where + " printed nothing: its last line must be a number or a JSON object with a '" + key + "' field");
  if (line.front() == '{') {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    SQ_CHECK(j.is_object(), ErrorKind::kInvalidArgument, where + ": its last line is not valid JSON: '" + line.substr(0, 200) + "'");
    SQ_CHECK(j.contains(key), ErrorKind::kInvalidArgument,
             where + ": its JSON output has no field '" + key + "' (--eval-key): '" + line.substr(0, 200) + "'");
    SQ_CHECK(j[key].is_number(), ErrorKind::kInvalidArgument,
             where + ": field '" + key + "' of its JSON output is not a number: " + j[key].dump().substr(0, 200));
    const double v = j[key].get<double>();
    SQ_CHECK(std::isfinite(v), ErrorKind::kInvalidArgument, where + ": field '" + key + "' is not finite");
    return v;
  }
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(line.c_str(), &end);
  SQ_CHECK(end != line.c_str() && *end == '\0' && errno == 0 && std::isfinite(v), ErrorKind::kInvalidArgument,
           where + ": its last line is neither a finite number nor a JSON object: '" + line.substr(0, 200) + "'");
  return v;
}

UserMetric command_metric(const CommandMetricOptions& options) {
  SQ_CHECK(!options.command.empty(), ErrorKind::kInvalidArgument, "--eval-command is empty");
  SQ_CHECK(options.command.find("{model}") != std::string::npos, ErrorKind::kInvalidArgument,
           "--eval-command '" + options.command + "' has no {model}: it is replaced by the candidate model's path");
  SQ_CHECK(!options.key.empty(), ErrorKind::kInvalidArgument, "--eval-key is empty");
  UserMetric m;
  m.name = options.key;
  m.higher_is_better = options.higher_is_better;
  m.evaluate = [options](const ir::Graph& model) { return run_command_on(options, model); };
  return m;
}

}  // namespace slimquant::analysis
