#include "cli/torch_inputs.hpp"

#include <fmt/format.h>

#include "sim/error.hpp"

namespace pipetune::cli {

void add_model_flags(CLI::App& app, ModelFlags& flags) {
  app.add_option("--model", flags.spec, "model: " + models::model_catalogue())
      ->required()
      ->type_name("SPEC");
  app.add_option("--dtype", flags.dtype_name, "float32 or float64 (default float32)")
      ->check(CLI::IsMember({"float32", "float64"}));
  app.add_flag(
      "--deferred-batch-norm", flags.deferred_batch_norm,
      "update batch-norm running statistics once per mini-batch, as full-batch training would");
}

models::Model build_model_from(const ModelFlags& flags, std::uint64_t seed) {
  models::ModelOptions options;
  options.dtype = flags.dtype();
  options.deferred_batch_norm = flags.deferred_batch_norm;
  options.seed = seed;
  return models::build_model(flags.spec, options);
}

void check_sm_partitions(int sm_partitions, const std::string& device, bool distributed) {
  if (sm_partitions > 0 && (device != "cuda" || distributed))
    throw InputError("--sm-partitions: only with --device cuda, in one process");
}

}  // namespace pipetune::cli
