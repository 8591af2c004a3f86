#pragma once

// Flags of the subcommands that run models (run, profile, validate, demo).

#include <c10/core/ScalarType.h>

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "executor/models/model.hpp"
#include "sim/plan.hpp"

namespace pipetune::cli {

struct ModelFlags {
  std::string spec;
  std::string dtype_name = "float32";
  bool deferred_batch_norm = false;
  c10::ScalarType dtype() const { return dtype_name == "float64" ? c10::kDouble : c10::kFloat; }
};

void add_model_flags(CLI::App& app, ModelFlags& flags);
models::Model build_model_from(const ModelFlags& flags, std::uint64_t seed);
/// `--sm-partitions` (> 0) of run and validate: only with `--device cuda`, in one process.
void check_sm_partitions(int sm_partitions, const std::string& device, bool distributed);

}  // namespace pipetune::cli
