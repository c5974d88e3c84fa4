#include "slimquant/core/progress.h"

#include <unistd.h>

#include <cstdio>

namespace slimquant {

namespace {
int& enabled_state() {
  static int state = -1;  // -1: decide from isatty
  return state;
}
bool enabled() {
  int& s = enabled_state();
  if (s < 0) s = isatty(STDERR_FILENO) ? 1 : 0;
  return s == 1;
}
std::string format_duration(double seconds) {
  char buf[32];
  if (seconds < 60) std::snprintf(buf, sizeof buf, "%.0fs", seconds);
  else if (seconds < 3600) std::snprintf(buf, sizeof buf, "%dm%02ds", int(seconds) / 60, int(seconds) % 60);
  else std::snprintf(buf, sizeof buf, "%dh%02dm", int(seconds) / 3600, int(seconds) % 3600 / 60);
  return buf;
}
}  // namespace

void Progress::set_enabled(bool e) { enabled_state() = e ? 1 : 0; }

Progress::Progress(std::string label, size_t total, std::string unit)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total), start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() { finish(); }

double Progress::elapsed_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::advance(size_t n) {
  done_ += n;
  auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ > std::chrono::milliseconds(200)) {
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
  if (!enabled()) return;
  const double t = elapsed_seconds();
  const double rate = t > 0 ? done_ / t : 0;
  std::string eta = rate > 0 && total_ > done_ ? format_duration((total_ - done_) / rate) + " left" : "";
  std::fprintf(stderr, "\r\033[K%s %zu/%zu %s (%.1f/s%s%s)%s%s", label_.c_str(), done_, total_, unit_.c_str(), rate,
               eta.empty() ? "" : ", ", eta.c_str(), note_.empty() ? "" : "  ", note_.c_str());
  if (final) std::fprintf(stderr, " in %s\n", format_duration(t).c_str());
  std::fflush(stderr);
}

}  // namespace slimquant
