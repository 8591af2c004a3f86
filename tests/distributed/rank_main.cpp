// One rank of the distributed executor's gradient test (distributed_test.cpp starts several).
// It runs one step of the plan in its process, then the same model unpipelined on the whole
// batch in-process (tests/executor/reference.hpp), and compares its own stages' gradients and,
// on rank 0, the merged loss with that reference. Exit 0: equal; 1: not; 2: could not run.
//
//   pipetune_distributed_rank MODEL_SPEC PLAN.json BATCH SEED
// with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set.
//
//   pipetune_distributed_rank --destroy-while-rank-0-is-stopped MODEL_SPEC PLAN.json BATCH
// builds the pipeline on every rank; then rank 0, which hosts the store, stops itself (SIGSTOP)
// and every other rank destroys its pipeline (and with it the transport) and prints on stderr
// how long that took: "destroyed in S s". A destructor must not wait on the silent peer.
//
//   pipetune_distributed_rank --gather-after-rank-1-dies
// connects with a 60 s timeout; rank 1 dies (SIGKILL) without reporting, the others gather a
// step's records as rank 0 does after every step. Rank 0 prints on stderr what it was told and
// how long it took: "gather failed in S s: MESSAGE". A dead rank must not be waited for.
//
//   pipetune_distributed_rank --a-sent-tensor-is-let-go
// rank 0 sends a tensor to rank 1 and, sending nothing more, waits up to 10 s for the transport
// to let go of it (its use count back to the test's own reference); rank 1 receives it. Rank 0
// prints "let go in S s" (exit 0) or "still held after 10 s" (exit 1).
//
//   pipetune_distributed_rank --a-tag-carries-tensors-of-changing-shapes
// rank 0 sends rank 1 tensors of changing shapes and dtypes on one tag; rank 1 checks each
// (exit 0: every one arrived as sent).

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "distributed/process_group.hpp"
#include "executor/executor.hpp"
#include "executor/placement.hpp"
#include "sim/plan.hpp"
#include "tests/executor/reference.hpp"

using namespace pipetune;

namespace {

int destroy_while_rank_0_is_stopped(const std::string& spec, const Plan& plan, std::int64_t batch) {
  const auto env = distributed::read_launch_environment();
  models::Model model = models::build_model(spec, {});
  exec::ExecutorOptions options;
  options.devices = exec::executor_devices(plan, "cpu");
  options.optimizer = exec::OptimizerKind::None;
  options.threads_per_cpu_device = 1;
  // A long timeout: without a bound of its own, a destructor would wait this long.
  std::shared_ptr<exec::Transport> transport = distributed::connect(env, 60.0);
  options.transport = transport;
  const Plan placed = exec::with_executor_devices(plan, options.devices);
  auto pipeline = std::make_unique<exec::Pipeline>(model, placed, batch, std::move(options));
  transport->barrier("ready");
  transport.reset();  // the pipeline holds the last reference
  if (env.rank == 0) {
    raise(SIGSTOP);  // the test continues it once the others are done
    std::_Exit(0);
  }
  // Rank 0 is stopped by now, and the heartbeat's next call to its store waits for an answer.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const auto started = std::chrono::steady_clock::now();
  pipeline.reset();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::fprintf(stderr, "rank %d: destroyed in %.3f s\n", env.rank, seconds);
  std::fflush(stderr);
  std::_Exit(0);
}

int gather_after_rank_1_dies() {
  const auto env = distributed::read_launch_environment();
  std::shared_ptr<exec::Transport> transport = distributed::connect(env, 60.0);
  transport->barrier("ready");
  if (env.rank == 1) raise(SIGKILL);
  const auto started = std::chrono::steady_clock::now();
  try {
    transport->gather("step 1", "record");
  } catch (const std::exception& e) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::fprintf(stderr, "rank %d: gather failed in %.3f s: %s\n", env.rank, seconds, e.what());
    std::fflush(stderr);
    std::_Exit(1);
  }
  std::_Exit(0);  // every rank but 0 only reports
}

int a_sent_tensor_is_let_go() {
  const auto env = distributed::read_launch_environment();
  std::shared_ptr<exec::Transport> transport = distributed::connect(env, 60.0);
  int status = 0;
  if (env.rank == 0) {
    at::Tensor sent = at::ones({1024, 256});
    transport->send(sent, 1, 7, transport->clock_ms());
    const auto started = std::chrono::steady_clock::now();
    double seconds = 0.0;
    while (sent.use_count() > 1 && seconds < 10.0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    }
    status = sent.use_count() > 1 ? 1 : 0;
    if (status == 0)
      std::fprintf(stderr, "rank 0: let go in %.3f s\n", seconds);
    else
      std::fprintf(stderr, "rank 0: still held after 10 s\n");
    std::fflush(stderr);
  } else if (env.rank == 1) {
    const exec::Received got = transport->recv(0, 7);
    if (got.tensor.numel() != 1024 * 256 || got.tensor.sum().item<double>() != 1024.0 * 256.0)
      status = 1;
  }
  transport->barrier("done");
  transport->flush_sends();
  return status;
}

// Rank 0 sends rank 1 five tensors on one tag: shapes 2x3, 2x3, 4, 2x3 (double), 4, each
// filled with its index; rank 1 checks each one's dtype, shape and values. The first takes the
// header-then-data path, the repeats the data receive posted early, a new shape or dtype the
// stand-in and the third tag.
int a_tag_carries_tensors_of_changing_shapes() {
  const auto env = distributed::read_launch_environment();
  std::shared_ptr<exec::Transport> transport = distributed::connect(env, 60.0);
  const std::vector<std::vector<std::int64_t>> shapes{{2, 3}, {2, 3}, {4}, {2, 3}, {4}};
  const std::vector<at::ScalarType> dtypes{at::kFloat, at::kFloat, at::kFloat, at::kDouble,
                                           at::kFloat};
  int wrong = 0;
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    if (env.rank == 0) {
      transport->send(
          at::full(shapes[k], static_cast<double>(k), at::TensorOptions().dtype(dtypes[k])), 1, 3,
          0.0);
    } else if (env.rank == 1) {
      const exec::Received got = transport->recv(0, 3);
      const bool ok = got.tensor.scalar_type() == dtypes[k] &&
                      got.tensor.sizes().vec() == shapes[k] &&
                      got.tensor.eq(static_cast<double>(k)).all().item<bool>();
      if (!ok) {
        std::fprintf(stderr, "rank 1: tensor %zu arrived as %s\n", k,
                     got.tensor.toString().c_str());
        ++wrong;
      }
    }
  }
  transport->barrier("done");
  transport->flush_sends();
  return wrong == 0 ? 0 : 1;
}

// Runs one of the modes above; what it could not run is "rank R: MESSAGE" and exit 2.
template <typename Mode>
int exit_2_on_error(Mode&& mode) {
  try {
    return mode();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %s: %s\n", std::getenv("RANK") ? std::getenv("RANK") : "?",
                 e.what());
    std::fflush(stderr);
    std::_Exit(2);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--gather-after-rank-1-dies") {
    return exit_2_on_error([] { return gather_after_rank_1_dies(); });
  }
  if (argc == 2 && std::string(argv[1]) == "--a-tag-carries-tensors-of-changing-shapes") {
    return exit_2_on_error([] { return a_tag_carries_tensors_of_changing_shapes(); });
  }
  if (argc == 2 && std::string(argv[1]) == "--a-sent-tensor-is-let-go") {
    return exit_2_on_error([] { return a_sent_tensor_is_let_go(); });
  }
  if (argc == 5 && std::string(argv[1]) == "--destroy-while-rank-0-is-stopped") {
    return exit_2_on_error([&] {
      return destroy_while_rank_0_is_stopped(argv[2], load_plan(argv[3]), std::stoll(argv[4]));
    });
  }
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s MODEL_SPEC PLAN.json BATCH SEED\n", argv[0]);
    return 2;
  }
  const std::string spec = argv[1];
  const Plan plan = load_plan(argv[2]);
  const std::int64_t batch = std::stoll(argv[3]);
  const std::uint64_t seed = std::stoull(argv[4]);
  try {
    const auto env = distributed::read_launch_environment();
    models::ModelOptions model_options;
    model_options.seed = seed;
    models::Model model = models::build_model(spec, model_options);
    models::Model reference = models::build_model(spec, model_options);

    exec::ExecutorOptions options;
    options.devices = exec::executor_devices(plan, "cpu");
    options.optimizer = exec::OptimizerKind::None;  // the gradients stay to be read
    options.threads_per_cpu_device = 1;
    options.seed = seed;
    options.transport = distributed::connect(env, 60.0);
    exec::Pipeline pipeline(model, exec::with_executor_devices(plan, options.devices), batch,
                            options);
    const auto [input, target] = model.make_batch(batch, seed, 0);
    const exec::StepRecord record = pipeline.step(input, target);

    const double reference_loss = testing::reference_step(reference, input, target, plan.chunks);
    const auto expected = testing::gradients(reference);
    int compared = 0, wrong = 0;
    for (int s = 0; s < plan.stages(); ++s) {
      if (pipeline.stage_device()[s] != env.rank) continue;
      for (const auto& p : pipeline.stages()[s]->named_parameters()) {
        const at::Tensor want = expected.at(p.key());
        const at::Tensor got = p.value().grad();
        ++compared;
        if (!got.defined() || !at::allclose(got, want, 1e-5, 1e-6)) {
          ++wrong;
          std::fprintf(stderr, "rank %d: stage %d: gradient of %s differs by %g\n", env.rank, s,
                       p.key().c_str(),
                       got.defined() ? (got - want).abs().max().item<double>() : INFINITY);
        }
      }
    }
    if (compared == 0) {
      std::fprintf(stderr, "rank %d: no parameters compared\n", env.rank);
      return 1;
    }
    if (env.rank == 0 &&
        std::abs(record.loss - reference_loss) > 1e-5 * std::max(1.0, std::abs(reference_loss))) {
      std::fprintf(stderr, "rank 0: loss %.9g, reference %.9g\n", record.loss, reference_loss);
      ++wrong;
    }
    std::printf("rank %d: %d gradients compared, %d differ; loss %.9g (reference %.9g)\n", env.rank,
                compared, wrong, record.loss, reference_loss);
    std::fflush(stdout);
    std::_Exit(wrong == 0 ? 0 : 1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %s: %s\n", std::getenv("RANK") ? std::getenv("RANK") : "?",
                 e.what());
    std::fflush(stderr);
    std::_Exit(2);
  }
}
