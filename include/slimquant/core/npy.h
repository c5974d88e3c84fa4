#pragma once
// NumPy .npy / .npz files: the interchange format for calibration data, captured activations and
// test fixtures. Little-endian, C-order arrays of the dtypes Tensor has (f4 f8 i1 u1 i2 u2 i4 u4 i8
// u8 b1) and float16 (f2, read as float32); header versions 1.0, 2.0 and 3.0. Errors name the file
// and the broken rule.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "slimquant/core/tensor.h"

namespace slimquant {

// What a .npy header says; data_offset is where the raw array bytes start in the file.
struct NpyHeader {
  DType dtype = DType::kUndefined;
  Shape shape;
  uint64_t data_offset = 0;
  // float16 data ('<f2'): dtype is then uint16, the stored bits; widen_float16 gives the values.
  bool stored_float16 = false;
};

// float16 bits (a uint16 tensor or array) as float32 values.
Tensor widen_float16(const Tensor& bits);
void widen_float16(const uint16_t* bits, int64_t count, float* dst);

// Reads only the header (cheap; for data sets that read samples on demand). Also checks that the
// file is long enough for the array the header announces.
// Throws kIo (missing / unreadable file) or kInvalidData (bad magic, fortran_order, big-endian,
// unsupported dtype, truncated data).
NpyHeader read_npy_header(const std::string& path);

// Reads the whole array (float16 data as float32).
Tensor read_npy(const std::string& path);

// Parses a .npy image held in memory; `what` names it in errors (e.g. "a.npz/x.npy").
Tensor parse_npy(const void* bytes, size_t size, const std::string& what);

// Serialises `t` as a version 1.0 .npy (2.0 when the header would not fit in 64 KiB).
std::vector<std::byte> encode_npy(const Tensor& t);

// Writes atomically: a temporary file next to `path`, then rename. Throws kIo on failure.
void write_npy(const std::string& path, const Tensor& t);
// Writes a float32 tensor as float16 ('<f2', rounded to nearest even), atomically.
void write_npy_float16(const std::string& path, const Tensor& t);

// Reads every array of a .npz archive (stored or deflated, zip64 included), in archive order; the
// names have their ".npy" suffix removed, as numpy.load does.
std::vector<std::pair<std::string, Tensor>> read_npz(const std::string& path);

}  // namespace slimquant
