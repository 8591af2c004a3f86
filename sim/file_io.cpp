#include "sim/file_io.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "sim/error.hpp"

namespace pipetune {

std::string read_text_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw InputError(path + ": is a directory, expected a file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw InputError(path + ": cannot read: " + std::strerror(errno));
  return text.str();
}

void write_text_file_atomically(const std::string& path, std::string_view text) {
  const std::string temporary = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) throw InputError(path + ": cannot write: " + std::strerror(errno));
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.flush();
    if (!out) {
      const int saved = errno;
      std::remove(temporary.c_str());
      throw InputError(path + ": cannot write: " + std::strerror(saved));
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const int saved = errno;
    std::remove(temporary.c_str());
    throw InputError(path + ": cannot write: " + std::strerror(saved));
  }
}

void check_writable(const std::string& path, std::string_view flag) {
  namespace fs = std::filesystem;
  std::error_code ec;
  auto fail = [&](const std::string& why) {
    throw InputError(std::string(flag) + ": " + path + ": cannot write: " + why);
  };
  if (fs::is_directory(path, ec)) fail("is a directory");
  const fs::path folder =
      fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
  if (!fs::is_directory(folder, ec)) fail("no folder " + folder.string());
  if (::access(folder.c_str(), W_OK) != 0) fail(std::strerror(errno));
}

}  // namespace pipetune
