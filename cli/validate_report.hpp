#pragma once

// validate's report, three ways: a terminal table, markdown (for a pull request or a wiki) and
// JSON (for programs; docs/cli.md). Also the thresholds that make validate fail.

#include <optional>
#include <string>
#include <vector>

#include "validate/validation.hpp"

namespace pipetune::cli {

struct ValidationThresholds {
  std::optional<double> time_error;    ///< |iteration time error|, a fraction
  std::optional<double> memory_error;  ///< |peak memory error| of any device, a fraction
  bool require_best = false;           ///< the predicted-best plan must measure best (within noise)
};

std::string validation_text(const validate::Validation& v);
std::string validation_markdown(const validate::Validation& v);
std::string validation_json(const validate::Validation& v, const ValidationThresholds& thresholds,
                            const std::vector<std::string>& failures);

/// One line per threshold exceeded, naming the plan, the error and the limit; empty: passed.
std::vector<std::string> threshold_failures(const validate::Validation& v,
                                            const ValidationThresholds& thresholds);

}  // namespace pipetune::cli
