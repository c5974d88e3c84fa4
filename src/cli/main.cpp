// slimquant: the command-line tool. Each subcommand lives in its own file; errors become a message
// on stderr ("error: ...") and one of README's exit codes, chosen by error kind (report_exception).
#include <iostream>

#include "cli/common.h"
#include "slimquant/core/distributed.h"
#include "slimquant/core/progress.h"

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
  app.set_version_flag("--version", "slimquant 0.1.0");
  bool quiet = false;
  app.add_flag("--quiet", quiet, "no progress output");
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
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every bad command line is README's 2, not CLI11's own codes.
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  } catch (...) {
    return cli::report_exception(std::current_exception());
  }
  if (quiet) Progress::set_enabled(false);
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
