#pragma once
// Progress for long jobs: "label 1200/10000 (85.3/s, 1m43s left)" redrawn on a terminal at most a
// few times a second; silent when stderr is not a terminal, unless a mode is set. The plain mode is
// for CI logs and files: whole lines, no carriage returns or escape codes, one every few seconds
// and one when the job ends.
#include <chrono>
#include <cstddef>
#include <string>

namespace slimquant {

class Progress {
 public:
  Progress(std::string label, size_t total, std::string unit = "samples");
  ~Progress();
  void advance(size_t n = 1);
  void set_note(std::string note) { note_ = std::move(note); }  // e.g. "loss 0.31"
  void finish();
  double elapsed_seconds() const;
  enum class Mode {
    kOff,       // nothing (--quiet)
    kTerminal,  // one line redrawn in place
    kPlain,     // a new line per update, every kPlainInterval, and the final one
  };
  static constexpr std::chrono::seconds kPlainInterval{5};
  // Global mode; default: kTerminal when stderr is a terminal, else kOff.
  static void set_mode(Mode mode);
  // true: kTerminal, false: kOff.
  static void set_enabled(bool enabled);

 private:
  void draw(bool final);
  std::string label_, unit_, note_;
  size_t total_, done_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool finished_ = false;
};

}  // namespace slimquant
