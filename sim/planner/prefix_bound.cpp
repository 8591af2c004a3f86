// The prefix bound (docs/planner.md, "The relaxed root's programme along the search"): the
// relaxed root's programme with the stages placed so far held at their work, a bound on every
// completion of a prefix of a single-stage balance. Kept per configuration, brought up to date
// along the search's path, tried at a stage only while it pays for itself, and run over runs of
// ends at once.

#include <algorithm>
#include <cmath>
#include <utility>

#include "sim/planner/single_stage_search.hpp"

namespace pipetune::planning {

// The last end b of stage j from a in [first, last] that the loop of search() would examine
// before its own breaks (the busy bound and the nested memory bound, which only grow with b):
// where the runs of prefix_alive() stop.
int SingleStageSearch::last_open_end(int j, int a, int first, int last, double arrive,
                                     double drain) const {
  const double limit = threshold(Objective::Time);
  auto open = [&](int b) {
    return arrive + busy(j, a, b) - tail(j, a, b) + drain < limit && fits_nested(j, a, b);
  };
  if (first > last || !open(first)) return first - 1;
  return last_holding(first, last, open);
}

// The runs of ends of stage j in [lo, hi] that the prefix programme does not rule out, in
// order: a run is ruled out whole when the programme with the stage's end anywhere in it is at
// the threshold, else halved, down to runs of kPrefixRunLeast / 2 ends or fewer, which the
// search examines end by end. Where every end of a parent's is ruled out, a few programmes do
// what one per end would.
void SingleStageSearch::prefix_alive(int j, int lo, int hi,
                                     std::vector<std::pair<int, int>>& alive) {
  const double limit = threshold(Objective::Time);
  if (counted_prefix_bound(j, lo, hi, limit, false) >= limit) return;
  if (hi - lo + 1 <= kPrefixRunLeast / 2) {
    if (!alive.empty() && alive.back().second + 1 == lo) {
      alive.back().second = hi;
    } else {
      alive.emplace_back(lo, hi);
    }
    return;
  }
  const int mid = lo + (hi - lo) / 2;
  prefix_alive(j, lo, mid, alive);
  prefix_alive(j, mid + 1, hi, alive);
}

double SingleStageSearch::counted_prefix_bound(int j, int lo, int hi, double limit, bool single) {
  PrefixDepth& depth = (*prefix_depths_)[j];
  const std::uint64_t before = context_.stats.steps;
  const double value = prefix_programme_bound(j, lo, hi, limit);
  const std::uint64_t spent = context_.stats.steps - before;
  ++depth.calls;
  depth.steps += spent;
  if (depth.trial) depth.trial_steps += spent;
  if (single) ++depth.single_calls;
  if (value >= limit) {
    depth.pruned += static_cast<std::uint64_t>(hi - lo + 1);  // a run counts each of its ends
    if (single) ++depth.single_pruned;
  }
  return value;
}

// Whether the prefix programme is worth its cost at stage j: what it has ruled out there, times
// what a prefix it lets through costs the search below it, against what it costs. Until a stage
// has that measure (its first calls), and for one call in 32 where it does not pay, so that the
// measure follows the search (its threshold falls, its prefixes change), it runs while such
// trials have spent less than kPrefixTrialShare of the configuration's steps: a programme of
// many classes costs thousands of steps, more than most configurations' whole searches.
bool SingleStageSearch::prefix_pays(int j) {
  if (!prefix_allowed_) return false;
  std::vector<PrefixDepth>& depths = *prefix_depths_;
  PrefixDepth& d = depths[j];
  auto may_try = [&] {
    std::uint64_t spent = 0;
    for (const PrefixDepth& other : depths) spent += other.trial_steps;
    const double steps =
        static_cast<double>(prefix_steps_before_ + static_cast<std::int64_t>(context_.stats.steps));
    d.trial = static_cast<double>(spent) <= kPrefixTrialShare * steps;
    return d.trial;
  };
  if (d.calls < kPrefixFirstCalls || d.subtrees == 0) return may_try();
  const double saved = static_cast<double>(d.pruned) / static_cast<double>(d.calls) *
                       static_cast<double>(d.subtree_steps) / static_cast<double>(d.subtrees);
  d.trial = false;
  if (saved > 2 * static_cast<double>(d.steps) / static_cast<double>(d.calls)) return true;
  return ++d.skipped % kPrefixSampleEvery == 0 && may_try();
}

// Brings the programmes of stages 0..j up to date with the search's path (balance_, stage j
// ending between lo and hi): a stage whose parent changed copies it and adds its constraints, a
// sibling moves their limits. Returns the tableau cells copied or pivoted, for the budget
// (`rows_cells`: a column in the current basis).
std::uint64_t SingleStageSearch::update_prefix_levels(int j, int lo, int hi,
                                                      std::uint64_t rows_cells) {
  if (prefix_levels_.size() < static_cast<std::size_t>(stages_)) prefix_levels_.resize(stages_);
  const int n_classes = static_cast<int>(prefix_->before.size());
  // Loosened by a billionth of the work, so that rounding cannot cut off the prefix itself.
  const double slack = 1e-9 * work_[layers_];
  std::uint64_t cells = 0;
  for (int k = 0, end = 0; k <= j; ++k) {
    end += k == j ? 0 : balance_[k];
    const int from = k == j ? lo : end, to = k == j ? hi : end;
    PrefixLevel& level = prefix_levels_[k];
    MinMaxShareProgramme& p = level.programme;
    const std::uint64_t parent_version =
        k == 0 ? prefix_root_version_ : prefix_levels_[k - 1].version;
    if (level.parent_version != parent_version) {
      p = k == 0 ? *prefix_->root : prefix_levels_[k - 1].programme;
      // The copy, and each constraint's column in the current basis (rows x rows).
      cells += p.tableau_cells() + 2 * static_cast<std::uint64_t>(n_classes) * rows_cells;
      const std::uint64_t added = p.pivot_cells();
      level.parent_version = parent_version;
      level.first_constraint = p.constraints();
      for (int c = 0; c < n_classes; ++c) {
        std::vector<double> a(static_cast<std::size_t>(n_classes) * stages_, 0.0);
        for (int s = 0; s <= k; ++s) a[c * stages_ + s] = 1.0;
        p.add_constraint(a, prefix_->before[c][from] - slack);
        for (double& v : a) v = -v;
        p.add_constraint(a, -prefix_->before[c][to] - slack);
      }
      cells += p.pivot_cells() - added;
    } else if (level.lo != from || level.hi != to) {
      const std::uint64_t moved = p.pivot_cells();
      for (int c = 0; c < n_classes; ++c) {
        p.set_constraint_limit(level.first_constraint + 2 * c, prefix_->before[c][from] - slack);
        p.set_constraint_limit(level.first_constraint + 2 * c + 1, -prefix_->before[c][to] - slack);
      }
      cells += p.pivot_cells() - moved;
    } else {
      continue;  // as it was
    }
    level.lo = from;
    level.hi = to;
    level.version = ++prefix_versions_;
  }
  return cells;
}

// The relaxed root's programme with stages 0..j held at their work (balance_, stage j ending
// between lo and hi): every row bounds every balance, and every completion of such a prefix
// meets the constraints (each class's work before an end only grows with it), so the least
// largest row bounds each. Each stage's programme is its parent's
// (the stage before's, or the root's) with two constraints per class; while the parent stays
// as it is, a sibling moves only their limits and solves on from the last basis, and a stage
// whose programme was not asked for at its own node is brought up to date here, lazily.
double SingleStageSearch::prefix_programme_bound(int j, int lo, int hi, double limit) {
  const int n_classes = static_cast<int>(prefix_->before.size());
  const std::uint64_t rows_cells = static_cast<std::uint64_t>(n_classes * stages_ + 1) *
                                   static_cast<std::uint64_t>(n_classes * stages_ + 1);
  std::uint64_t cells = update_prefix_levels(j, lo, hi, rows_cells);
  MinMaxShareProgramme& p = prefix_levels_[j].programme;
  const std::uint64_t solved = p.pivot_cells();
  std::vector<double> shares;
  double value = p.solve(&shares, nullptr, limit) * (1.0 - 1e-12);
  // Cutting planes, as at the root: the longest paths of the shares' own plan, which holds
  // the prefix. The root's paths are those of its own shares; with the prefix held the shares
  // move, and the paths with them (on bench's 1,000 x 16 profile of unequal devices, the
  // prefixes of four stages that the root's rows let through all fell to these). Only the
  // path of the least ratios, not the root's second one of the mean ratios: that one doubled
  // the sweeps and filled the rows, and the unequal case's proof took 25.8 M steps instead of
  // 17.3 M (the capped lognormal one 13.4 M instead of 11.2 M).
  // A stage's programme keeps the rows its siblings added, up to kPrefixRowsMost beyond the
  // root's: each column costs every later pivot and copy.
  const std::size_t most_functions = prefix_->root->functions() + kPrefixRowsMost;
  RootPaths& paths = *prefix_->paths;
  PrefixDepth& depth = (*prefix_depths_)[j];
  const bool cuts = value < limit && p.functions() < most_functions && depth.cut_due();
  for (int round = 0;
       cuts && round < kPrefixRounds && value < limit && p.functions() < most_functions; ++round) {
    double a = 0.0;
    std::vector<double> row;
    const std::size_t priced = paths.joint.size();
    const double at = path_row(paths, shares, false, a, row);
    // The sweep, and each new count vector's walk over the layers.
    context_.stats.steps += sweep_->task_count() / kIterationSweepTasksPerStep +
                            (paths.joint.size() - priced) * static_cast<std::uint64_t>(layers_) / 8;
    ++depth.cut_sweeps;
    if (!(at > value * (1.0 + 1e-9))) break;
    ++depth.cut_rows;
    p.add(a, row);
    cells += rows_cells;  // the new column in the current basis
    value = std::max(value, p.solve(&shares, nullptr, limit) * (1.0 - 1e-12));
  }
  cells += p.pivot_cells() - solved;
  context_.stats.steps += cells / kPivotCellsPerStep;
  ++context_.stats.prefix_programmes;
  return value;
}

// The relaxed root, its programme kept with entry `e` for the prefix bounds.
double SingleStageSearch::keep_prefix_programme(Entry& e, std::vector<int>& relaxed,
                                                RelaxedRows* rows) {
  RelaxedRows own;
  RelaxedRows& kept = rows != nullptr ? *rows : own;
  std::shared_ptr<const MinMaxShareProgramme> programme;
  auto prefix = std::make_shared<PrefixProgrammes>();
  const double root = relaxed_root(relaxed, &kept, &programme, &prefix->paths);
  prefix->root = std::move(programme);
  const int n_classes = static_cast<int>(kept.totals.size());
  // Kept within a memory budget, first come first kept: the cheap pass opens the configurations
  // with the lowest bounds first. A 3,000-layer model on 4 devices with a batch of 1,024 has a
  // thousand of them, each programme of 16 classes a few hundred kilobytes.
  prefix->bytes = sizeof(double) * (prefix->root->tableau_cells() +
                                    (prefix->root->functions() + prefix->root->constraints()) *
                                        prefix->paths->width +
                                    static_cast<std::size_t>(n_classes + 4) * (layers_ + 1));
  if (prefix_bytes_ + prefix->bytes > kPrefixProgrammeBytes) return root;
  prefix->before = class_work_before(kept.class_of, n_classes);
  prefix_bytes_ += prefix->bytes;
  e.prefix = std::move(prefix);
  return root;
}

std::vector<std::vector<double>> SingleStageSearch::prefix_bounds_of(const std::vector<Plan>& plans,
                                                                     int widen, double limit) {
  if (plans.empty()) return {};
  const Config config = context_.config_of(plans.front());
  Entry e;
  e.config = &config;
  std::vector<PrefixDepth>* const kept_depths = open_alone(e);
  std::vector<std::vector<double>> bounds;
  for (const Plan& plan : plans) {
    balance_ = plan.balance;
    std::vector<double>& of = bounds.emplace_back();
    for (int j = 0, b = 0; j + 1 < stages_; ++j) {
      const int start = b;
      b += plan.balance[j];
      const int lo = std::max(start + 1, b - widen);
      const int hi = std::min(layers_ - (stages_ - 1 - j), b + widen);
      // Without a programme (one larger than the memory budget) the bound is nothing.
      of.push_back(prefix_ ? prefix_programme_bound(j, lo, hi, limit) : 0.0);
    }
  }
  prefix_depths_ = kept_depths;  // e's are gone on return
  return bounds;
}

}  // namespace pipetune::planning
