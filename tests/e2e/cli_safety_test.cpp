// Hostile and careless command lines: outputs that would destroy an input or a special file, model
// directories, colliding output names, concurrent analyses, bad numeric flags and image bombs.
// Each test fails if its protection is removed.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/preprocess.h"
#include "slimquant/analysis/checkpoint.h"
#include "slimquant/core/atomic_file.h"
#include "slimquant/core/npy.h"
#include "slimquant/data/dataset.h"
#include "slimquant/ir/onnx_io.h"
#include "test_util.h"

using namespace slimquant;
using test::file_bytes;
using test::run_cli;
namespace fs = std::filesystem;

namespace {

const std::string kResnetSmall = test::fixture_model("resnet_small");
const std::string kCalib = " --dataset fashion-mnist:train --limit 64 --batch-size 32 --batch-nums 1 --no-eval ";
const std::string kQatData = " --dataset fashion-mnist:train --limit 64 --batch-size 32 --calib-batches 1 --no-eval ";

std::string data_flags(const std::string& cmd) { return cmd == "qat" ? kQatData : kCalib; }

bool contains(const std::string& text, const std::string& words) { return text.find(words) != std::string::npos; }

// ---- 1. output paths ---------------------------------------------------------------------------

TEST(CliOutputPaths, OutputNamingTheInputModelIsRefusedAndTheModelKept) {
  test::TempDir tmp("out_is_input");
  fs::copy_file(kResnetSmall, tmp.path("m.onnx"));
  fs::create_hard_link(tmp.path("m.onnx"), tmp.path("alias.onnx"));  // the same file under another name
  const std::string before = file_bytes(tmp.path("m.onnx"));
  for (const std::string cmd : {"quantize", "qat"}) {
    for (const std::string& out : {tmp.path("m.onnx"), tmp.path("alias.onnx"), tmp.path("./m.onnx")}) {
      auto r = run_cli(cmd + " " + tmp.path("m.onnx") + data_flags(cmd) + "-o " + out);
      EXPECT_EQ(r.exit_code, 5) << cmd << " -o " << out << "\n" << r.output;
      EXPECT_TRUE(contains(r.output, "would destroy the input")) << r.output;
      EXPECT_FALSE(contains(r.output, "quantized ")) << "refused only after calibrating:\n" << r.output;
    }
  }
  EXPECT_EQ(file_bytes(tmp.path("m.onnx")), before);
  // The QAT checkpoint is an output too.
  auto ckpt = run_cli("qat " + tmp.path("m.onnx") + kQatData + "-o " + tmp.path("q.onnx") + " --checkpoint " + tmp.path("m.onnx"));
  EXPECT_EQ(ckpt.exit_code, 5) << ckpt.output;
  EXPECT_EQ(file_bytes(tmp.path("m.onnx")), before);
}

TEST(CliOutputPaths, DirectoriesAndSpecialFilesAreNeverReplaced) {
  test::TempDir tmp("out_special");
  fs::create_directories(tmp.path("dir"));
  ASSERT_EQ(::mkfifo(tmp.path("fifo").c_str(), 0600), 0);
  // A FIFO stands for /dev/null and other special files (tests must not risk the real device: as
  // root a rename replaces it).
  for (const std::string& out : {tmp.path("dir"), tmp.path("fifo")}) {
    auto r = run_cli("quantize " + kResnetSmall + kCalib + "-o " + out);
    EXPECT_EQ(r.exit_code, 7) << out << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, out)) << r.output;
    EXPECT_TRUE(contains(r.output, "is a directory") || contains(r.output, "is a FIFO")) << r.output;
    EXPECT_FALSE(contains(r.output, "quantized ")) << "refused only after calibrating:\n" << r.output;
  }
  EXPECT_TRUE(fs::is_directory(tmp.path("dir")));
  EXPECT_TRUE(fs::is_fifo(tmp.path("fifo")));
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
}

TEST(AtomicFile, NeverRenamesOverASpecialFile) {
  test::TempDir tmp("atomic_special");
  ASSERT_EQ(::mkfifo(tmp.path("fifo").c_str(), 0600), 0);
  try {
    write_file_atomic(tmp.path("fifo"), "bytes");
    FAIL() << "the FIFO was replaced";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_TRUE(contains(e.what(), "is a FIFO")) << e.what();
  }
  EXPECT_TRUE(fs::is_fifo(tmp.path("fifo")));
  EXPECT_THROW(write_file_atomic("/dev/null", "bytes"), Error);
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
  EXPECT_THROW(write_file_atomic(tmp.path(), "bytes"), Error);  // a directory
  for (const auto& e : fs::directory_iterator(tmp.path()))  // no temporary left behind
    EXPECT_EQ(e.path().filename(), "fifo");
  // The same file through a symlink counts as the input.
  std::ofstream(tmp.path("in.bin")) << "input";
  fs::create_symlink(tmp.path("in.bin"), tmp.path("link.bin"));
  EXPECT_THROW(check_output_path(tmp.path("link.bin"), {tmp.path("in.bin")}, "-o"), Error);
  EXPECT_NO_THROW(check_output_path(tmp.path("new.bin"), {tmp.path("in.bin")}, "-o"));
}

// ---- 2. a model directory ----------------------------------------------------------------------

TEST(CliModelDirectory, QuantizeTakesTheOnlyOnnxFileOfADirectory) {
  test::TempDir tmp("model_dir");
  fs::create_directories(tmp.path("one"));
  fs::copy_file(kResnetSmall, tmp.path("one/model.onnx"));
  auto r = run_cli("quantize " + tmp.path("one") + kCalib + "--json -o " + tmp.path("q.onnx"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto end = r.output.find_last_not_of('\n');
  const auto j = nlohmann::json::parse(r.output.substr(r.output.rfind('\n', end) + 1));
  EXPECT_EQ(j["fp32_bytes"].get<uint64_t>(), fs::file_size(kResnetSmall));
  EXPECT_TRUE(fs::is_regular_file(tmp.path("q.onnx")));

  fs::create_directories(tmp.path("two"));
  fs::copy_file(kResnetSmall, tmp.path("two/a.onnx"));
  fs::copy_file(kResnetSmall, tmp.path("two/b.onnx"));
  fs::create_directories(tmp.path("none"));
  for (const std::string dir : {"two", "none"}) {
    auto bad = run_cli("quantize " + tmp.path(dir) + kCalib + "-o " + tmp.path(dir + ".onnx"));
    EXPECT_EQ(bad.exit_code, 5) << bad.output;
    EXPECT_TRUE(contains(bad.output, "must hold exactly one")) << bad.output;
    EXPECT_FALSE(fs::exists(tmp.path(dir + ".onnx")));
  }
}

// ---- 3. run: output names that collide as file names --------------------------------------------

TEST(CliRun, OutputsWhoseFileNamesCollideGetDistinctFilesAndAnIndex) {
  test::TempDir tmp("run_collide");
  ir::Graph g;
  g.name = "collide";
  g.opset = 13;
  g.inputs = {{"x", DType::kFloat32, std::vector<ir::Dim>{{2, ""}, {3, ""}}}};
  const std::vector<ir::Dim> dims{{2, ""}, {3, ""}};
  g.outputs = {{"a/b", DType::kFloat32, dims}, {"a_b", DType::kFloat32, dims}};
  ir::Node relu, neg;
  relu.op_type = "Relu";
  relu.name = "relu";
  relu.inputs = {"x"};
  relu.outputs = {"a/b"};
  neg.op_type = "Neg";
  neg.name = "neg";
  neg.inputs = {"x"};
  neg.outputs = {"a_b"};
  g.nodes = {relu, neg};
  ir::save_onnx(g, tmp.path("m.onnx"));
  Tensor x(DType::kFloat32, {2, 3});
  for (int i = 0; i < 6; ++i) x.data<float>()[i] = static_cast<float>(i) - 2.5f;
  write_npy(tmp.path("x.npy"), x);
  auto r = run_cli("run " + tmp.path("m.onnx") + " --input x=" + tmp.path("x.npy") + " --output-dir " + tmp.path("out"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto index = nlohmann::json::parse(file_bytes(tmp.path("out/outputs.json")));
  EXPECT_EQ(index, (nlohmann::json{{"a_b.npy", "a/b"}, {"a_b_2.npy", "a_b"}}));
  const Tensor relu_out = read_npy(tmp.path("out/a_b.npy")), neg_out = read_npy(tmp.path("out/a_b_2.npy"));
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(relu_out.data<float>()[i], std::max(0.f, x.data<float>()[i]));
    EXPECT_EQ(neg_out.data<float>()[i], -x.data<float>()[i]);
  }
  EXPECT_TRUE(contains(r.output, "a/b float32[2x3] -> " + tmp.path("out/a_b.npy"))) << r.output;
}

// ---- 4. analyses sharing a save dir -----------------------------------------------------------------

TEST(CliAnalyze, ASaveDirInUseByAnotherProcessIsRefused) {
  test::TempDir tmp("analyze_lock");
  {
    analysis::DirectoryLock held(tmp.path(), "--save-dir");  // stands in for a running analysis
    EXPECT_THROW(analysis::DirectoryLock(tmp.path(), "--save-dir"), Error);
    auto r = run_cli("analyze " + kResnetSmall + " fashion-mnist:test --limit 32 --batch-nums 1 --eval-batch-size 32 "
                     "--metric sqnr --num-histogram-plots 0 --save-dir " + tmp.path());
    EXPECT_EQ(r.exit_code, 7) << r.output;
    EXPECT_TRUE(contains(r.output, "in use by another slimquant process (pid " + std::to_string(::getpid()) + ")"))
        << r.output;
    EXPECT_FALSE(fs::exists(tmp.path("analysis_checkpoint.json")));
    auto q = run_cli("analyze-qat --quant-model " + kResnetSmall + " --float-model " + kResnetSmall +
                     " fashion-mnist:test --limit 32 --save-dir " + tmp.path());
    EXPECT_EQ(q.exit_code, 7) << q.output;
  }
  analysis::DirectoryLock after(tmp.path(), "--save-dir");  // released with its holder
}

TEST(CliAnalyze, AnotherMetricInTheSameSaveDirIsRefusedNotMixed) {
  test::TempDir tmp("analyze_mix");
  const std::string base = "analyze " + kResnetSmall + " fashion-mnist:test --limit 32 --batch-nums 1 --eval-batch-size 32 "
                           "--num-histogram-plots 0 --save-dir " + tmp.path() + " --metric ";
  auto first = run_cli(base + "sqnr");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string report = file_bytes(tmp.path("analysis.json"));
  auto second = run_cli(base + "cosine");
  EXPECT_EQ(second.exit_code, 5) << second.output;
  EXPECT_TRUE(contains(second.output, "belongs to a different analysis: metric")) << second.output;
  EXPECT_EQ(file_bytes(tmp.path("analysis.json")), report);
}

// ---- 5. checkpoint checksums -------------------------------------------------------------------

TEST(AnalysisCheckpoint, CorruptedOrUncheckedStateIsRefused) {
  test::TempDir tmp("ckpt_crc");
  const std::string path = tmp.path("c.json");
  analysis::Checkpoint c(path, {{"metric", "sqnr"}});
  c.save({{"batches_done", 3}, {"base", {1.5, 2.25}}});
  EXPECT_EQ(c.load()["batches_done"], 3);
  auto doc = nlohmann::json::parse(file_bytes(path));
  doc["state"]["base"][0] = 1.75;  // a changed number still parses
  std::ofstream(path, std::ios::trunc) << doc.dump();
  try {
    c.load();
    FAIL() << "a corrupted checkpoint was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
    EXPECT_TRUE(contains(e.what(), path)) << e.what();
    EXPECT_TRUE(contains(e.what(), "CRC-32")) << e.what();
  }
  doc.erase("crc32");
  std::ofstream(path, std::ios::trunc) << doc.dump();
  EXPECT_THROW(c.load(), Error);
}

// ---- 7/8. exit codes and numeric flags ------------------------------------------------------------

TEST(CliExitCodes, BadCommandLinesExit2AndNegativeCountsNameTheFlag) {
  struct Case {
    std::string args, flag;
  };
  const std::vector<Case> cases = {
      {"quantize " + kResnetSmall + " --batch-nums -1 -o /tmp/x.onnx", "--batch-nums"},
      {"quantize " + kResnetSmall + " --batch-size 0 -o /tmp/x.onnx", "--batch-size"},
      {"eval " + kResnetSmall + " --limit -1", "--limit"},
      {"eval " + kResnetSmall + " --threads -5", "--threads"},
      {"bench " + kResnetSmall + " --runs 0", "--runs"},
      {"qat " + kResnetSmall + " --epochs -2 -o /tmp/x.onnx", "--epochs"},
      {"qat " + kResnetSmall + " --lr -0.1 -o /tmp/x.onnx", "--lr"},
      {"analyze " + kResnetSmall + " --num-histogram-plots -1", "--num-histogram-plots"},
      {"analyze " + kResnetSmall + " --hist-percent 2", "--hist-percent"},
      {"eval " + kResnetSmall + " --channels 2", "--channels"},
      {"quantize " + kResnetSmall, "--output"},          // a required option missing
      {"no-such-command", "subcommand"},           // CLI11's own codes (106, 109) before
      {"eval " + kResnetSmall + " --no-such-flag", "--no-such-flag"},
  };
  for (const auto& c : cases) {
    auto r = run_cli(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, c.flag)) << c.args << "\n" << r.output;
  }
  EXPECT_EQ(run_cli("--help").exit_code, 0);
  EXPECT_EQ(run_cli("quantize --help").exit_code, 0);
  EXPECT_EQ(run_cli("--version").exit_code, 0);
}

TEST(CliExitCodes, ConfigValuesAreCheckedLikeFlags) {
  test::TempDir tmp("config_values");
  std::ofstream(tmp.path("neg.yaml")) << "batch_size: -1\n";
  const std::string calib = " --dataset fashion-mnist:train --limit 64 --batch-nums 1 --no-eval ";
  auto neg = run_cli("quantize " + kResnetSmall + calib + "--config " + tmp.path("neg.yaml") + " -o " + tmp.path("q.onnx"));
  EXPECT_EQ(neg.exit_code, 5) << neg.output;  // std::stoul wrapped it to 2^64-1, or exit 1 on text
  EXPECT_TRUE(contains(neg.output, "batch_size")) << neg.output;
  std::ofstream(tmp.path("text.yaml")) << "batch_size: many\n";
  auto qat = run_cli("qat " + kResnetSmall + " --dataset fashion-mnist:train --limit 64 --no-eval --config " + tmp.path("text.yaml") + " -o " + tmp.path("q.onnx"));
  EXPECT_EQ(qat.exit_code, 5) << qat.output;
  EXPECT_TRUE(contains(qat.output, "batch_size")) << qat.output;
  std::ofstream(tmp.path("broken.yaml")) << "ptq_config: [unclosed\n";
  auto broken = run_cli("quantize " + kResnetSmall + kCalib + "--config " + tmp.path("broken.yaml") + " -o " + tmp.path("q.onnx"));
  EXPECT_EQ(broken.exit_code, 5) << broken.output;
  // A special file as MODEL is refused, not read forever.
  auto dev = run_cli("info /dev/zero");
  EXPECT_EQ(dev.exit_code, 5) << dev.output;
  EXPECT_TRUE(contains(dev.output, "not a regular file")) << dev.output;
}

// ---- 9. image size limits ----------------------------------------------------------------------

// A PNG that declares width x height (the IHDR chunk only: the check must not need the pixels).
std::string png_header(uint32_t width, uint32_t height) {
  std::string ihdr = "IHDR";
  for (uint32_t v : {width, height})
    for (int s = 24; s >= 0; s -= 8) ihdr += static_cast<char>((v >> s) & 0xFF);
  ihdr += std::string("\x08\x00\x00\x00\x00", 5);  // 8-bit grayscale
  const uint32_t crc = static_cast<uint32_t>(::crc32(0, reinterpret_cast<const Bytef*>(ihdr.data()), static_cast<uInt>(ihdr.size())));
  std::string png("\x89PNG\r\n\x1a\n", 8);
  png += std::string("\x00\x00\x00\x0d", 4) + ihdr;
  for (int s = 24; s >= 0; s -= 8) png += static_cast<char>((crc >> s) & 0xFF);
  return png;
}

TEST(ImageLimits, HugeDeclaredSizeIsRefusedBeforeDecoding) {
  test::TempDir tmp("image_bomb");
  std::ofstream(tmp.path("bomb.png"), std::ios::binary) << png_header(30000, 30000);
  const auto dims = data::detail::read_image_header_dims(tmp.path("bomb.png"));
  ASSERT_TRUE(dims.has_value());
  EXPECT_EQ(dims->width, 30000u);
  EXPECT_EQ(dims->height, 30000u);
  std::ofstream(tmp.path("list.txt")) << tmp.path("bomb.png") << " 0\n";
  try {
    data::DataOptions options;
    options.spec = "images:" + tmp.path("list.txt");
    auto d = data::open_dataset(options);
    d->sample(0);
    FAIL() << "the 30000x30000 image was decoded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
    EXPECT_TRUE(contains(e.what(), "bomb.png")) << e.what();
    EXPECT_TRUE(contains(e.what(), "30000x30000")) << e.what();
    EXPECT_TRUE(contains(e.what(), "limit of 100000000")) << e.what();
  }
  // Real files of every format with a header reader: the declared size is the decoded size.
  cv::Mat img(37, 53, CV_8UC3, cv::Scalar(10, 20, 30));
  for (const std::string ext : {".png", ".jpg", ".bmp", ".webp", ".tiff", ".ppm"}) {
    const std::string path = tmp.path("small" + ext);
    ASSERT_TRUE(cv::imwrite(path, img)) << ext;
    const auto d = data::detail::read_image_header_dims(path);
    ASSERT_TRUE(d.has_value()) << ext;
    EXPECT_EQ(d->width, 53u) << ext;
    EXPECT_EQ(d->height, 37u) << ext;
    EXPECT_NO_THROW(data::detail::check_image_before_decoding(path, "test")) << ext;
  }
}

}  // namespace
