#include "slimquant/analysis/ctc.h"

#include <algorithm>
#include <fstream>

#include "slimquant/core/error.h"

namespace slimquant::analysis {

std::vector<std::string> read_ctc_keys(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorKind::kIo, "key file '" + path + "' cannot be opened (missing or unreadable)");
  std::vector<std::string> keys;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    keys.push_back(line);
  }
  if (in.bad()) fail(ErrorKind::kIo, "key file '" + path + "': read failed");
  if (keys.empty()) fail(ErrorKind::kInvalidData, "key file '" + path + "' is empty (expected one key per line)");
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].empty())
      fail(ErrorKind::kInvalidData, "key file '" + path + "': line " + std::to_string(i + 1) + " is empty");
    utf8_code_points(keys[i]);  // invalid UTF-8 fails here, naming the text
  }
  return keys;
}

CtcDecoder::CtcDecoder(std::vector<std::string> keys) : keys_(std::move(keys)) {
  SQ_CHECK(!keys_.empty(), ErrorKind::kInvalidArgument, "CTC decoding needs at least one key");
}

void CtcDecoder::check_classes(long long classes) const {
  const long long k = static_cast<long long>(keys_.size());
  SQ_CHECK(classes == k + 1 || classes == k + 2, ErrorKind::kInvalidArgument,
           "the model outputs " + std::to_string(classes) + " classes per time step, but the key file has " +
               std::to_string(k) + " keys (expected " + std::to_string(k + 1) + ": blank + keys, or " +
               std::to_string(k + 2) + ": blank + keys + space)");
}

std::string CtcDecoder::decode_indices(const std::vector<long long>& classes_per_step, long long classes) const {
  check_classes(classes);
  const long long k = static_cast<long long>(keys_.size());
  std::string text;
  long long previous = -1;
  for (long long c : classes_per_step) {
    SQ_CHECK(c >= 0 && c < classes, ErrorKind::kInvalidArgument,
             "class " + std::to_string(c) + " is out of range for " + std::to_string(classes) + " classes");
    if (c != previous && c != 0) text += c <= k ? keys_[static_cast<size_t>(c - 1)] : std::string(" ");
    previous = c;
  }
  return text;
}

std::string CtcDecoder::decode(const float* scores, long long steps, long long classes) const {
  std::vector<long long> best(static_cast<size_t>(std::max(0LL, steps)));
  for (long long t = 0; t < steps; ++t) {
    const float* row = scores + t * classes;
    best[static_cast<size_t>(t)] = std::max_element(row, row + classes) - row;
  }
  return decode_indices(best, classes);
}

std::u32string utf8_code_points(std::string_view text) {
  std::u32string out;
  auto bad = [&] { fail(ErrorKind::kInvalidData, "text '" + std::string(text) + "' is not valid UTF-8"); };
  for (size_t i = 0; i < text.size();) {
    const unsigned char b = static_cast<unsigned char>(text[i]);
    const int extra = b < 0x80 ? 0 : (b >> 5) == 0x6 ? 1 : (b >> 4) == 0xE ? 2 : (b >> 3) == 0x1E ? 3 : -1;
    if (extra < 0 || i + static_cast<size_t>(extra) >= text.size()) bad();  // lead byte, then room for the rest
    char32_t cp = extra == 0 ? b : b & (0x3F >> extra);
    for (int k = 1; k <= extra; ++k) {
      const unsigned char c = static_cast<unsigned char>(text[i + static_cast<size_t>(k)]);
      if ((c >> 6) != 0x2) bad();
      cp = (cp << 6) | (c & 0x3F);
    }
    out.push_back(cp);
    i += static_cast<size_t>(extra) + 1;
  }
  return out;
}

size_t edit_distance(std::u32string_view a, std::u32string_view b) {
  // One row of the dynamic-programming table at a time.
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

double normalized_edit_distance(std::string_view prediction, std::string_view label) {
  const std::u32string p = utf8_code_points(prediction), l = utf8_code_points(label);
  const size_t longest = std::max(p.size(), l.size());
  return longest == 0 ? 0.0 : static_cast<double>(edit_distance(p, l)) / static_cast<double>(longest);
}

std::string without_spaces(std::string_view text) {
  std::string out;
  for (char c : text)
    if (c != ' ') out += c;
  return out;
}

}  // namespace slimquant::analysis
