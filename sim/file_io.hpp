#pragma once

#include <string>
#include <string_view>

namespace pipetune {

/// The whole file as text; InputError naming the path when it cannot be read.
std::string read_text_file(const std::string& path);

/// Writes to a temporary name beside `path` and renames it into place, so a reader never sees a
/// half-written file and an old file survives a failed write. InputError when it cannot.
void write_text_file_atomically(const std::string& path, std::string_view text);

}  // namespace pipetune
