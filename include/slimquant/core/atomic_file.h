#pragma once
// Atomic file writes: the bytes go to a temporary file next to the target, which is then renamed
// over it, so a crash leaves either the old file or the new one, never a torn one (checkpoints,
// caches, saved models).
#include <string>
#include <string_view>
#include <vector>

namespace slimquant {

// Throws kIo naming `path` when the directory is missing or not writable, the write fails, or
// `path` exists and is not a regular file: a rename never replaces a directory, a device such as
// /dev/null, a FIFO or a socket (see check_output_path).
void write_file_atomic(const std::string& path, std::string_view bytes);

// The checks an output path must pass, for commands to run before any long work: its directory
// exists; `path` is not an existing directory or special file (kIo); and it is not the same file
// (same inode, through links) as any of `inputs` (kInvalidArgument), so a command never overwrites
// what it reads. `what` names the path in messages (e.g. "-o").
void check_output_path(const std::string& path, const std::vector<std::string>& inputs = {},
                       const std::string& what = "output");

// Reads a whole file; throws kIo when it cannot be opened.
std::string read_file(const std::string& path);

}  // namespace slimquant
