#pragma once

#include <string>
#include <string_view>

namespace pipetune {

/// The whole file as text; InputError naming the path when it cannot be read.
std::string read_text_file(const std::string& path);

/// Writes to a temporary name beside `path` and renames it into place, so a reader never sees a
/// half-written file and an old file survives a failed write. InputError when it cannot.
void write_text_file_atomically(const std::string& path, std::string_view text);

/// InputError ("FLAG: PATH: cannot write: REASON") unless a file could be written at `path`:
/// its folder exists and is writable, and it is not a folder itself. Checked before long work,
/// so the work is not lost at the end.
void check_writable(const std::string& path, std::string_view flag);

}  // namespace pipetune
