#pragma once
// What every part of one planner search shares (docs/planner.md): the configurations, the
// devices as the search sees them, the simulator and the stats every part charges, and each
// configuration's state between its slices of the budget (Entry). The parts:
//   search.hpp               PlanSearch: configurations, their slices of the budget, the ranking;
//   single_stage_search.hpp  SingleStageSearch: one stage per device, its tables and bounds;
//   multi_stage_search.hpp   MultiStageSearch: several stages per device.

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "sim/cost_model.hpp"
#include "sim/hardware.hpp"
#include "sim/planner/multi_stage_peak_bound.hpp"
#include "sim/planner/planner.hpp"
#include "sim/planner/relaxed_shares.hpp"
#include "sim/profile.hpp"
#include "sim/schedule.hpp"
#include "sim/simulator.hpp"

namespace pipetune::planning {

// One configuration: a micro-batch split (as tensor.chunk makes it), a checkpoint mode and a
// schedule. Chunk counts that give the same split are one configuration.
struct Config {
  std::vector<std::int64_t> sizes;
  int chunks = 0;  // the smallest chunk count that gives this split
  CheckpointMode checkpoint = CheckpointMode::Never;
  ScheduleKind schedule = ScheduleKind::GPipe;
  int stages_per_device = 1;  // > 1: a multi-stage schedule (searched by MultiStageSearch)
  double lower_bound = 0.0;   // on the iteration time of any balance

  bool multi_stage() const { return is_multi_stage(schedule); }

  int micro_batches() const { return static_cast<int>(sizes.size()); }
  bool recomputed(int i) const { return is_checkpointed(checkpoint, i, micro_batches()); }
};

// torchgpipe's checkpoint_stop: micro-batches [0, stop) are recomputed.
int recompute_stop(const Config& config);

// What is needed to judge the candidates: the best plan of each configuration so far, and the
// threshold a configuration must beat to make the top N.
class Ranking {
 public:
  explicit Ranking(std::size_t size) : size_(std::max<std::size_t>(size, 1)) {}
  double threshold() const {
    return entries_.size() < size_ ? kInf : entries_[size_ - 1].iteration_ms;
  }
  void insert(PlanCandidate c) {
    auto at = std::upper_bound(entries_.begin(), entries_.end(), c.iteration_ms,
                               [](double t, const PlanCandidate& e) { return t < e.iteration_ms; });
    entries_.insert(at, std::move(c));
    if (entries_.size() > size_) entries_.pop_back();
  }
  std::vector<PlanCandidate> take() { return std::move(entries_); }

 private:
  std::size_t size_;
  std::vector<PlanCandidate> entries_;
};

// A simulated balance's score: less memory excess, then less time, is better.
struct Score {
  double excess = 0.0, time = 0.0;  // bytes over the tightest cap, simulated time
};
inline bool better(const Score& x, const Score& y) {
  return x.excess < y.excess || (x.excess == y.excess && x.time < y.time);
}

// The parts' own state an Entry keeps between slices (single_stage_search.hpp,
// multi_stage_search.hpp).
struct SingleStageTables;
struct RelaxedRows;
struct PrefixProgrammes;
struct PrefixDepth;
struct RelaxedRootState;

// Each configuration's state between its slices of the search.
struct Entry {
  // Out of line: the parts' state it holds is declared, not defined, here.
  Entry();
  ~Entry();
  Entry(Entry&&) noexcept;
  Entry& operator=(Entry&&) noexcept;

  const Config* config = nullptr;
  double root = 0.0;              // lower bound on every plan of the configuration
  double best = kInf;             // its best fitting plan so far
  PlanCandidate candidate;        // that plan
  std::uint64_t slice = 0;        // the steps its last slice was given
  std::vector<int> resume;        // where its last slice stopped (see search())
  std::vector<int> relaxed_plan;  // single-stage: the relaxed root's, until searched around
  std::unique_ptr<SingleStageTables> tables;  // its tables between slices (store_tables())
  // Multi-stage: its local search has found a local optimum (the enumeration goes on).
  bool settled = false;
  int move = 0;           // multi-stage: the layers the local search moves at a time, 0: not yet
  bool widening = false;  // multi-stage: past one layer, the moves grow again
  bool ranged = false;    // multi-stage: no move between stages further apart improves either
  std::vector<std::vector<int>> relaxed;  // multi-stage: the relaxed root's plans, rounded
  std::vector<int> balance;               // multi-stage: the local search's current balance
  Score score;                            // and its score
  std::vector<std::int64_t> peaks;        // and its simulated peak per device
  // Multi-stage: fitting starts the local search descends from once its current descent ends
  // (one descent from the best start alone ended on 2.5 % slower plans than from another).
  std::vector<std::vector<int>> starts;
  int kicks = 0;  // multi-stage: starts made by kicking the best plan (multi_stage_local_search())
  // Multi-stage: the local search starts over from `b` (its score and peaks), the widest moves
  // first (move 0 until a slice sets it).
  void restart_at(std::vector<int> b, const Score& s, std::vector<std::int64_t> p) {
    balance = std::move(b);
    score = s;
    peaks = std::move(p);
    settled = ranged = widening = false;
    move = 0;
  }
  ConfigurationStats stats;  // what was spent on it
  bool closed = false;       // searched to the end, or ruled out by a bound
  double polished = kInf;    // the best plan polish() last started from
  // With memory caps, the relaxed root's programme until capped_root() has used it.
  std::unique_ptr<RelaxedRows> capped_rows;
  // Single-stage: the relaxed root's programme for the prefix bound, and what it did per stage.
  std::shared_ptr<const PrefixProgrammes> prefix;
  std::vector<PrefixDepth> prefix_depths;
  // Multi-stage: the relaxed root ran all its rounds (else a slice runs it on, further).
  bool root_complete = false;
  // Multi-stage: where the relaxed root's rounds stopped, until they are complete.
  std::unique_ptr<RelaxedRootState> root_state;
  // Multi-stage: the relaxed root with its paths' copies at distinct outputs (copies_bound of
  // multi_stage_relaxed_root()), counted only once the search is over.
  double copies_root = 0.0;
  // Multi-stage, under caps: MultiStagePeakBound::may_fit() has run (it waits for the first
  // slice once the cheap pass has spent half the budget).
  bool fit_checked = false;
  // Multi-stage, under caps: the relaxed root's rows, for may_fit() with the time, and the
  // least plan to beat that it was asked about.
  std::unique_ptr<StageWorkRows> time_rows;
  double fast_checked = kInf;
  // Multi-stage, under caps: its MultiStagePeakBound, built once (peak_bound()).
  std::unique_ptr<MultiStagePeakBound> peak;
};

// One search's devices, simulator and stats, shared by its parts; and what each part asks of a
// plan (simulated, fitting its caps, as a candidate).
class SearchContext {
 public:
  SearchContext(const Profile& profile, const Hardware& hardware, const PlannerOptions& options);

  const Profile& profile;
  const PlannerOptions& options;
  const CostModel costs;
  const Hardware& hardware;
  Simulator simulator;
  const int stages, layers;  // devices (stage j of a single-stage plan on device j), layers
  const double overhead;     // per task launched
  std::vector<double> speed;
  std::vector<std::int64_t> capacity;         // 0: no cap
  std::vector<const Link*> link;              // after device j; null after the last
  std::vector<bool> receives_senders_tensor;  // per device: StagePeakShape's, from the hardware
  double total_speed = 0.0, max_speed = 0.0;
  PlannerStats stats;  // what every part spent, in steps of the budget

  bool capped() const {  // some device has a memory cap
    return std::any_of(capacity.begin(), capacity.end(), [](std::int64_t c) { return c > 0; });
  }
  // A configuration's stage count: its stages per device on every device.
  int stage_count(const Config& c) const { return c.stages_per_device * stages; }
  Config config_of(const Plan& plan) const;
  // Per stage of c, its device (torch's stage-to-programme mapping, programme r on device r).
  std::vector<int> stage_devices_of(const Config& c) const;
  Plan plan_of(const Config& c, std::vector<int> balance) const;
  PlanCandidate candidate_of(const Config& c, const Plan& plan, const SimulationResult& r) const;
  // Whether the runtime runs the plan's balance (PlannerOptions::stage_inputs_unchanged,
  // stage_outputs_detachable).
  bool runs(const Plan& plan) const;
  // runs() and r.fits(), and with worst_order_memory its worst arrival order's peaks fit as well
  // (then `worst` holds them, per device).
  bool fits(const Plan& plan, const SimulationResult& r, std::vector<std::int64_t>& worst);
  // Per device, the plan's peak in the worst arrival order (one simulation, a max-flow each;
  // not counted in the stats).
  std::vector<std::int64_t> worst_order_peaks_of(const Plan& plan);
  // Simulates `balance` for entry e, keeps it if it is e's best; its score (`excess`: by how
  // much the largest peak exceeds its cap).
  Score simulate_for(Entry& e, const std::vector<int>& balance,
                     std::vector<std::int64_t>* peaks = nullptr);
  // A simulation of `plan`, charged: a step per task and run of the event engine (co-run and
  // after-idle times settle by up to 33 runs: charged one, a CPU profile's 20-layer model spent
  // 16 s on a budget of 10 M steps), and half a step per layer and micro-batch size the stages'
  // memory walks cover, where the simulator does not hold them from an earlier run (about 30 ns
  // a layer: with one micro-batch on 120 layers they were most of a simulation, and a budget of
  // 10 M steps ran 2.6 s).
  SimulationResult simulate_charged(const Plan& plan, const SimulationOptions& options) {
    const std::uint64_t walked = simulator.memory_walk_layers();
    const std::uint64_t runs = simulator.engine_runs();
    SimulationResult r = simulator.run(plan, options);
    ++stats.simulations;
    stats.steps += r.task_count * (simulator.engine_runs() - runs) +
                   (simulator.memory_walk_layers() - walked) / 2;
    return r;
  }
  // Every output a stage boundary can carry at a micro-batch size, smallest first (for
  // least_boundary_copies_ms()), sorted once per size.
  const std::vector<double>& boundary_bytes_ascending(const SizeCosts& size) const;

 private:
  mutable std::map<const SizeCosts*, std::vector<double>> boundary_bytes_;
};

// A part of one search (SingleStageSearch, MultiStageSearch): its context, and the context's
// device facts that every bound reads, under the part's own names.
class SearchPart {
 protected:
  explicit SearchPart(SearchContext& context)
      : context_(context),
        stages_(context.stages),
        layers_(context.layers),
        overhead_(context.overhead),
        speed_(context.speed) {}

  SearchContext& context_;
  const int stages_, layers_;
  const double overhead_;
  const std::vector<double>& speed_;
};

}  // namespace pipetune::planning
