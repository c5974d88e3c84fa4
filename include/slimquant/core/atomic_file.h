#pragma once
// Atomic file writes: the bytes go to a temporary file next to the target, which is then renamed
// over it, so a crash leaves either the old file or the new one, never a torn one (checkpoints,
// caches, saved models).
#include <string>
#include <string_view>

namespace slimquant {

// Throws kIo naming `path` when the directory is missing or not writable, or the write fails.
void write_file_atomic(const std::string& path, std::string_view bytes);

// Reads a whole file; throws kIo when it cannot be opened.
std::string read_file(const std::string& path);

}  // namespace slimquant
