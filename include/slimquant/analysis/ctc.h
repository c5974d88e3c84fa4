#pragma once
// Text recognition scoring as PaddleOCR does it: CTC greedy decoding of [N, T, C] class
// probabilities through a key file (ppocr_keys_v1.txt and the like), exact-match and normalized edit
// distance (PaddleOCR's RecMetric).
#include <string>
#include <string_view>
#include <vector>

namespace slimquant::analysis {

// One key (a UTF-8 string, normally a single character) per line; "\n" or "\r\n" line ends, the last
// line may lack one. Throws kIo for a missing or unreadable file, kInvalidData for an empty one.
std::vector<std::string> read_ctc_keys(const std::string& path);

// Class c of the model's output: 0 is the CTC blank, 1..K are keys[0..K-1] in file order, and a
// model with K+2 classes has a space as its last class (PaddleOCR's use_space_char).
class CtcDecoder {
 public:
  explicit CtcDecoder(std::vector<std::string> keys);
  size_t num_keys() const { return keys_.size(); }
  // Checks that a model with `classes` output classes fits the keys (K+1 or K+2); kInvalidArgument
  // naming both counts otherwise.
  void check_classes(long long classes) const;
  // Greedy decoding of one sequence of `steps` rows of `classes` scores: argmax per step (the first
  // on ties), repeats collapsed, blanks dropped, classes mapped to keys.
  std::string decode(const float* scores, long long steps, long long classes) const;
  // The same from class indices (argmax already taken).
  std::string decode_indices(const std::vector<long long>& classes_per_step, long long classes) const;

 private:
  std::vector<std::string> keys_;
};

// UTF-8 text as code points; invalid UTF-8 is kInvalidData naming the text.
std::u32string utf8_code_points(std::string_view text);
// Levenshtein distance over code points.
size_t edit_distance(std::u32string_view a, std::u32string_view b);
// PaddleOCR's normalized edit distance: distance / max(length), 0 when both are empty.
double normalized_edit_distance(std::string_view prediction, std::string_view label);
// PaddleOCR's RecMetric compares text with spaces removed (ignore_space=True).
std::string without_spaces(std::string_view text);

}  // namespace slimquant::analysis
