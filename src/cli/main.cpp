// slimquant: the command-line tool. Each subcommand lives in its own file; errors become a message
// on stderr ("error: ...") and one of README's exit codes, chosen by error kind (report_exception).
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "cli/common.h"
#include "slimquant/core/distributed.h"
#include "slimquant/core/progress.h"

namespace {

// PaddleSlim writes its parameters with underscores (--batch_nums, --weight_quantize_type); the flags
// here are dashed. "--batch_nums=4" -> "--batch-nums=4": only the name part of "--" words before a
// "--" separator changes, never values.
std::vector<std::string> dashed_flag_names(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    std::string& arg = args[i];
    if (arg == "--") break;
    if (arg.size() <= 2 || arg.compare(0, 2, "--") != 0) continue;
    const size_t name_end = std::min(arg.find('='), arg.size());
    std::replace(arg.begin() + 2, arg.begin() + static_cast<std::ptrdiff_t>(name_end), '_', '-');
  }
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace slimquant;
  // Under mpirun every rank runs the command; rank 0 alone prints and writes (docs/scale-out.md).
  distributed::init(&argc, &argv);
  struct Finalize {
    ~Finalize() { distributed::finalize(); }
  } finalize;
  if (!distributed::is_root()) {
    std::cout.rdbuf(nullptr);
    Progress::set_enabled(false);
  }
  CLI::App app{"slimquant: INT8 quantization, analysis and inference for ONNX models"};
  app.require_subcommand(1);
  app.fallthrough();  // --quiet and --progress also after the subcommand (subcommands inherit this)
  app.set_version_flag("--version", "slimquant 0.1.0");
  bool quiet = false;
  app.add_flag("--quiet", quiet, "no progress output");
  std::string progress_mode = "auto";
  app.add_option("--progress", progress_mode,
                 "progress on stderr: auto (redrawn line on a terminal, none otherwise), plain (whole lines every "
                 "few seconds, for CI logs), none")
      ->check(CLI::IsMember({"auto", "plain", "none"}))
      ->capture_default_str();
  std::vector<std::pair<CLI::App*, cli::Action>> commands;
  auto add = [&](cli::Action (*reg)(CLI::App&)) {
    size_t before = app.get_subcommands({}).size();
    cli::Action a = reg(app);
    commands.push_back({app.get_subcommands({}).at(before), std::move(a)});
  };
  add(cli::register_info);
  add(cli::register_run);
  add(cli::register_eval);
  add(cli::register_bench);
  add(cli::register_quantize);
  add(cli::register_qat);
  add(cli::register_analyze);
  add(cli::register_analyze_qat);
  try {
    const std::vector<std::string> args = dashed_flag_names(argc, argv);
    std::vector<const char*> arg_pointers;
    for (const auto& arg : args) arg_pointers.push_back(arg.c_str());
    app.parse(argc, arg_pointers.data());
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every bad command line is README's 2, not CLI11's own codes.
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  } catch (...) {
    return cli::report_exception(std::current_exception());
  }
  if (progress_mode == "plain") Progress::set_mode(Progress::Mode::kPlain);
  if (progress_mode == "none" || quiet) Progress::set_mode(Progress::Mode::kOff);
  try {
    for (auto& [sub, action] : commands)
      if (sub->parsed()) return action();
  } catch (...) {
    const int code = cli::report_exception(std::current_exception());
    // The other ranks may be waiting in a collective: stop the whole job with this exit code.
    if (distributed::size() > 1) distributed::abort(code);
    return code;
  }
  return 0;
}
