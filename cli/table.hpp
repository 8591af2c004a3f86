#pragma once

#include <string>
#include <vector>

namespace pipetune::cli {

/// A plain-text table: columns padded to their widest cell, numbers right-aligned.
class TextTable {
 public:
  enum class Align { Left, Right };
  void add_column(std::string header, Align align = Align::Left);
  void add_row(std::vector<std::string> cells);
  std::string render() const;  ///< header, rows; two spaces between columns; no trailing blanks

 private:
  std::vector<std::string> headers_;
  std::vector<Align> aligns_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace pipetune::cli
