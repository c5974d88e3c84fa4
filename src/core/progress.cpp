#include "slimquant/core/progress.h"

#include <unistd.h>

#include <cstdio>
#include <optional>

namespace slimquant {

namespace {
std::optional<Progress::Mode>& mode_state() {
  static std::optional<Progress::Mode> state;  // unset: decide from isatty
  return state;
}
Progress::Mode mode() {
  auto& s = mode_state();
  if (!s) s = isatty(STDERR_FILENO) ? Progress::Mode::kTerminal : Progress::Mode::kOff;
  return *s;
}
std::string format_duration(double seconds) {
  char buf[32];
  if (seconds < 60) std::snprintf(buf, sizeof buf, "%.0fs", seconds);
  else if (seconds < 3600) std::snprintf(buf, sizeof buf, "%dm%02ds", int(seconds) / 60, int(seconds) % 60);
  else std::snprintf(buf, sizeof buf, "%dh%02dm", int(seconds) / 3600, int(seconds) % 3600 / 60);
  return buf;
}
}  // namespace

void Progress::set_mode(Mode m) { mode_state() = m; }
void Progress::set_enabled(bool e) { set_mode(e ? Mode::kTerminal : Mode::kOff); }

Progress::Progress(std::string label, size_t total, std::string unit)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total), start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() { finish(); }

double Progress::elapsed_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::advance(size_t n) {
  done_ += n;
  auto now = std::chrono::steady_clock::now();
  const std::chrono::milliseconds interval = mode() == Mode::kPlain ? kPlainInterval : std::chrono::milliseconds(200);
  if (now - last_draw_ > interval) {
    last_draw_ = now;
    draw(false);
  }
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  draw(true);
}

void Progress::draw(bool final) {
  const Mode m = mode();
  if (m == Mode::kOff) return;
  const double t = elapsed_seconds();
  const double rate = t > 0 ? done_ / t : 0;
  std::string eta = rate > 0 && total_ > done_ ? format_duration((total_ - done_) / rate) + " left" : "";
  std::fprintf(stderr, "%s%s %zu/%zu %s (%.1f/s%s%s)%s%s", m == Mode::kTerminal ? "\r\033[K" : "", label_.c_str(),
               done_, total_, unit_.c_str(), rate,
               eta.empty() ? "" : ", ", eta.c_str(), note_.empty() ? "" : "  ", note_.c_str());
  if (final) std::fprintf(stderr, " in %s\n", format_duration(t).c_str());
  else if (m == Mode::kPlain) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

}  // namespace slimquant
