// The single-stage relaxed roots: every stage's bounds at once over continuous shares of the
// work, with and without memory caps.

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <queue>

#include "sim/planner/single_stage_search.hpp"

namespace pipetune::planning {

// wait_bound() of every stage at once, with the stages' work shared out continuously (docs/
// planner.md, "The relaxed root"). The tables bound the stages not yet placed one at a time, so
// they must time every round trip through later stages at the fastest device's speed; here the
// trips go through the later stages at their own speeds, which is what decides the bubble when
// devices differ. Each stage j gets a share x_j of the iteration's work (work_); every quantity
// wait_bound() adds up over a stage's layers is bounded through its least (or, where it is
// subtracted, its largest) ratio to a layer's work, so that for every balance each stage's
// wait_bound() is at least a linear function of the shares, one per way its waits' excesses can
// be clipped at zero. The least largest of those functions over all shares (a linear programme,
// min_max_share_bound()) is at most the least largest wait_bound() over balances, so at most
// every plan's simulated time. Copies count their least size.
RootPaths::RootPaths(const SizeCosts& first_size, const SizeCosts& last_size,
                     RatioClasses ratio_classes, std::vector<double> work, int stages)
    : first(&first_size),
      last(&last_size),
      classes(std::move(ratio_classes)),
      layer_work(std::move(work)),
      n_classes(static_cast<int>(classes.work.size())),
      width(static_cast<std::size_t>(n_classes) * stages),
      model(stages) {
  for (auto& kind : task_ratio) kind = {ClassRatio(n_classes), ClassRatio(n_classes)};
  for (auto& kind : task_mean_ratio) kind.fill(std::vector<double>(n_classes, 0.0));
  for (std::size_t x = 0; x < layer_work.size(); ++x) {
    for (int kind = 0; kind < 4; ++kind) {
      for (int slot = 0; slot < 2; ++slot) {
        const double ms = task_ms(kind, slot, static_cast<int>(x));
        task_ratio[kind][slot].add(classes.of[x], ms, layer_work[x]);
        task_total[kind][slot] += ms;
        task_mean_ratio[kind][slot][classes.of[x]] += ms;
      }
    }
  }
  for (auto& kind : task_mean_ratio)
    for (auto& slot : kind)
      for (int x = 0; x < n_classes; ++x)
        slot[x] = classes.work[x] > 0.0 ? slot[x] / classes.work[x] : 0.0;
  mean_is_least = true;
  for (int kind = 0; kind < 4; ++kind)
    for (int slot = 0; slot < 2; ++slot)
      for (int x = 0; x < n_classes; ++x)
        mean_is_least =
            mean_is_least && task_mean_ratio[kind][slot][x] == task_ratio[kind][slot].lower(x);
}

const std::vector<double>& RootPaths::joint_least(const std::array<int, 8>& counts) {
  auto [it, added] = joint.try_emplace(counts);
  if (added) {
    it->second = joint_least_ratios(
        counts, [&](int q, int x) { return task_ms(q / 2, q % 2, x); }, classes, layer_work);
  }
  return it->second;
}

double SingleStageSearch::least_copy(const RootPaths& paths, int j, bool last_size) const {
  const std::vector<double>& outputs =
      context_.boundary_bytes_ascending(last_size ? *paths.last : *paths.first);
  return !outputs.empty() && outputs.front() < kInf ? context_.link[j]->transfer_ms(outputs.front())
                                                    : 0.0;
}

double SingleStageSearch::path_row(RootPaths& paths, const std::vector<double>& shares, bool mean,
                                   double& a, std::vector<double>& row) const {
  const int n_classes = paths.n_classes;
  for (int k = 0; k < stages_; ++k) {
    StageDurations& d = paths.model[k];
    for (int slot = 0; slot < 2; ++slot) {
      auto time = [&](int kind) {
        double ms = overhead_;
        for (int x = 0; x < n_classes; ++x)
          ms += (mean ? paths.task_mean_ratio[kind][slot][x]
                      : paths.task_ratio[kind][slot].lower(x)) *
                shares[x * stages_ + k] / speed_[k];
        return ms;
      };
      d.forward[slot] = time(0);
      d.forward_nograd[slot] = time(1);
      d.backward[slot] = time(3);
      d.activation_copy[slot] = k + 1 < stages_ ? least_copy(paths, k, slot == 1) : 0.0;
      // A boundary in a frozen stem carries no gradient: then the least is none.
      const bool every_gradient =
          context_.costs.layer_count() < 2 || context_.costs.input_needs_gradient(1);
      d.gradient_copy[slot] = k > 0 && every_gradient ? least_copy(paths, k - 1, slot == 1) : 0.0;
    }
  }
  IterationSweep::PathCounts& path = paths.path;
  sweep_->run_critical_path(paths.model, path);
  // The least count of each kind of task (and size) over the stages: that many such tasks on
  // every stage cover every layer that many times, whatever the balance, so they count their
  // exact sum (at the fastest speed, each stage adding its own speed's excess through its
  // ratios); only the path's other tasks depend on the shares. A round trip of one
  // micro-batch, most of the iteration when micro-batches are few, then loses nothing to the
  // classes' width. With one class the rows stay as they were: the exact sums moved its
  // roots little, but the capped root's branching reads the solve's shares, and bench's
  // capped lognormal case (one class) ended 0.714 % from its answer instead of 0.667 %.
  a = 0.0;
  row.assign(paths.width, 0.0);
  std::array<int, 8> common{};
  if (n_classes > 1) {
    common = path.tasks[0];
    for (int k = 1; k < stages_; ++k)
      for (int q = 0; q < 8; ++q) common[q] = std::min(common[q], path.tasks[k][q]);
  }
  for (int q = 0; q < 8; ++q) a += common[q] * paths.task_total[q / 2][q % 2] / context_.max_speed;
  const std::vector<double>& common_least = paths.joint_least(common);
  // Copies: their latencies, and their bytes by boundary, priced together below.
  std::array<std::vector<double>, 2> per_byte;
  for (auto& w : per_byte) w.assign(stages_, 0.0);
  for (int k = 0; k < stages_; ++k) {
    std::array<int, 8> rest = path.tasks[k];
    for (int q = 0; q < 8; ++q) {
      a += rest[q] * overhead_;
      rest[q] -= common[q];
    }
    const std::vector<double>& least = paths.joint_least(rest);
    const double excess = 1.0 / speed_[k] - 1.0 / context_.max_speed;
    for (int cls = 0; cls < n_classes; ++cls)
      row[cls * stages_ + k] += least[cls] / speed_[k] + common_least[cls] * excess;
    for (int slot = 0; slot < 2 && k + 1 < stages_; ++slot) {
      const int copies = path.copies[k][slot] + path.copies[k][2 + slot];
      a += copies * context_.link[k]->transfer_ms(0.0);
      // A gradient into a frozen stem carries no byte (CostModel::input_needs_gradient).
      const int carrying = context_.costs.has_frozen() ? path.copies[k][slot] : copies;
      per_byte[slot][k] = carrying * ms_per_byte(*context_.link[k]);
    }
  }
  a += least_boundary_copies_ms(per_byte[0], context_.boundary_bytes_ascending(*paths.first)) +
       least_boundary_copies_ms(per_byte[1], context_.boundary_bytes_ascending(*paths.last));
  double at_shares = a;
  for (std::size_t x = 0; x < paths.width; ++x) at_shares += row[x] * shares[x];
  return at_shares;
}

// wait_bound()'s cases over the layers' ratios: the micro-batch q whose backward ends the waits
// and whose gradient drains to stage 0 (GPipe: 0's, with the waits of M - 1; 1F1B: the last one,
// and with a smaller last one also the last full-size one, M - 2, which follows micro-batch 0's
// trip).
struct SingleStageSearch::RootCase {
  int q;
  const SizeCosts* drained;
  bool q_trip_last;  // q's round trip is the last micro-batch's
  ClassRatio path;   // micro-batch 0's forward and q's backward through a stage
  std::vector<std::array<ClassRatio, 2>> fill;
  std::vector<ClassRatio> tail;
  // Per stage: its waits with every task its overhead alone (their shape, and the part of the
  // fillers and the tail that does not grow with the stage).
  std::vector<WaitTerms> overhead;
};

// The cases of the prepared configuration with each layer's ratios added, and the round trips'
// ratios (`trip_first`, `trip_last`).
std::vector<SingleStageSearch::RootCase> SingleStageSearch::root_cases(
    const RatioClasses& classes, const std::vector<double>& layer_work, ClassRatio& trip_first,
    ClassRatio& trip_last) const {
  const Config& c = *config_;
  const int m = c.micro_batches();
  const bool gpipe = c.schedule == ScheduleKind::GPipe;
  const bool uneven = m >= 2 && c.sizes.back() != c.sizes.front();
  const SizeCosts& f = *first_size_;
  const SizeCosts& l = *last_size_;
  const int n_classes = static_cast<int>(classes.work.size());
  auto ratio = [&] { return ClassRatio(n_classes); };
  std::vector<RootCase> cases;
  cases.push_back({m - 1, gpipe ? &f : &l, true, ratio(), {}, {}, {}});
  if (!gpipe && uneven) cases.push_back({m - 2, &f, false, ratio(), {}, {}, {}});
  StageDurations overhead_only;
  overhead_only.forward = overhead_only.forward_nograd =
      overhead_only.backward = {overhead_, overhead_};
  for (RootCase& k : cases) {
    k.fill.assign(stages_, {ratio(), ratio()});
    k.tail.assign(stages_, ratio());
    for (int j = 0; j < stages_; ++j) k.overhead.push_back(wait_terms(j, overhead_only, k.q));
  }
  trip_first = ratio();
  trip_last = ratio();
  for (int x = 0; x < layers_; ++x) {
    const double work = layer_work[x];
    const int cls = classes.of[x];
    trip_first.add(cls, pass_first_[x] - pass_first_[x + 1], work);
    trip_last.add(cls, pass_last_[x] - pass_last_[x + 1], work);
    // The device's times alone, as every bound here takes them: a task that the host's launches
    // pace takes longer, which can only make the iteration longer, so the bounds stay bounds.
    const StageDurations d = stage_durations(f, l, x, x + 1, 1.0, 0.0, nullptr, nullptr,
                                             /*with_launches=*/false);
    for (RootCase& k : cases) {
      k.path.add(
          cls,
          (c.recomputed(0) ? f.forward_nograd_ms[x] : f.forward_ms[x]) + k.drained->backward_ms[x],
          work);
      for (int j = 0; j < stages_; ++j) {
        const WaitTerms t = wait_terms(j, d, k.q);
        for (int i = 0; i < t.count; ++i) k.fill[j][i].add(cls, t.wait[i].fill, work);
        k.tail[j].add(cls, t.tail, work);
      }
    }
  }
  return cases;
}

// wait_bound()'s rows over the shares, per case and stage (into rows.constant and rows.slope):
// a stage's own work after the passes through the stages before it, and each way of adding its
// waits' excesses.
void SingleStageSearch::root_wait_rows(const RootPaths& paths, const std::vector<RootCase>& cases,
                                       const ClassRatio& trip_first, const ClassRatio& trip_last,
                                       RelaxedRows& rows) const {
  const int m = config_->micro_batches();
  const int n_classes = paths.n_classes;
  auto least_copy = [&](int j, bool last_size) { return this->least_copy(paths, j, last_size); };
  // A row's slopes, one block of stages per class: a quantity of stage s at least (or, sign
  // -1, at most) its ratio to the stage's work in each class, over the stage's speed.
  const std::size_t width = static_cast<std::size_t>(n_classes) * stages_;
  auto add = [&](std::vector<double>& row, int s, const ClassRatio& r, double sign) {
    for (int k = 0; k < n_classes; ++k)
      row[k * stages_ + s] += sign * (sign > 0 ? r.lower(k) : r.most[k]) / speed_[s];
  };
  ClassRatio own(n_classes);  // a stage's busy work is its work, exactly
  for (int k = 0; k < n_classes; ++k) own.least[k] = own.most[k] = 1.0;
  for (const RootCase& k : cases) {
    const bool drained_last = k.drained == last_size_;
    for (int j = 0; j < stages_; ++j) {
      // Micro-batch 0's forwards and q's backwards through the stages before j, with their
      // copies; stage j's own work, less what follows q's backward (1F1B's M - 2 case only).
      double base = overhead_ * tasks_per_stage_;
      std::vector<double> g(width, 0.0);
      for (int s = 0; s < j; ++s) {
        base += 2.0 * overhead_ + least_copy(s, false) + least_copy(s, drained_last);
        add(g, s, k.path, 1.0);
      }
      add(g, j, own, 1.0);
      if (k.q != m - 1) {
        base -= k.overhead[j].tail + k.tail[j].workless / speed_[j];
        add(g, j, k.tail[j], -1.0);
      }
      rows.constant.push_back(base);
      rows.slope.push_back(g);
      if (j + 1 == stages_) continue;
      // Each wait: the round trip through the later stages at their speeds, less the most of
      // stage j's work that fills it.
      const WaitTerms& t = k.overhead[j];
      const double onward = 2.0 * overhead_ * (stages_ - 1 - j) + after_latency_[j];
      std::array<double, 2> wait_constant{};
      std::array<std::vector<double>, 2> wait_slope;
      for (int i = 0; i < t.count; ++i) {
        const bool last_trip = !t.wait[i].first_trip && k.q_trip_last;
        wait_constant[i] = onward + 2.0 * least_copy(j, last_trip) - t.wait[i].fill -
                           k.fill[j][i].workless / speed_[j];
        wait_slope[i].assign(width, 0.0);
        for (int s = j + 1; s < stages_; ++s)
          add(wait_slope[i], s, last_trip ? trip_last : trip_first, 1.0);
        add(wait_slope[i], j, k.fill[j][i], -1.0);
      }
      // Every way of clipping the excesses: one at a time when they overlap, any set when they
      // add up.
      for (int mask = 1; mask < (1 << t.count); ++mask) {
        if (!t.both && (mask & (mask - 1)) != 0) continue;
        double a = base;
        std::vector<double> row = g;
        for (int i = 0; i < t.count; ++i) {
          if (!(mask & (1 << i))) continue;
          a += wait_constant[i];
          for (std::size_t x = 0; x < width; ++x) row[x] += wait_slope[i][x];
        }
        rows.constant.push_back(a);
        rows.slope.push_back(std::move(row));
      }
    }
  }
}

// Paths of the iteration itself (cutting planes): every path of the task graph is at most the
// simulated time, and its length is at least a linear function of the shares (path_row()). Each
// round times the shares' own plan, adds the rows of its longest paths and the hull's edges
// that the shares cross where they are above the bound or crossed, and solves again; each
// solution is a bound, and they only grow. It stops when a round adds nothing or after
// kRelaxedRootRounds rounds. The paths' rows are added to `rows` too; returns the bound.
double SingleStageSearch::root_cutting_planes(MinMaxShareProgramme& programme, RootPaths& paths,
                                              ContiguityHull& hull, RelaxedRows& rows,
                                              std::vector<double>& shares) const {
  double bound = programme.solve(&shares);
  for (int round = 0; round < kRelaxedRootRounds; ++round) {
    // The edges the shares cross and the paths of their plan, then one solve.
    bool added = hull.add_crossed(programme, shares, stages_) > 0;
    double last_a = -1.0;
    std::vector<double> last_row;
    for (const bool mean : {false, true}) {
      double a = 0.0;
      std::vector<double> row;
      // With one ratio per class both models find the same path: its row once.
      if (!(path_row(paths, shares, mean, a, row) > bound * (1.0 + 1e-9)) ||
          (a == last_a && row == last_row))
        continue;
      last_a = a;
      last_row = row;
      programme.add(a, row);
      rows.constant.push_back(a);
      rows.slope.push_back(std::move(row));
      added = true;
    }
    if (!added) break;
    bound = std::max(bound, programme.solve(&shares));
  }
  return bound;
}

double SingleStageSearch::relaxed_root(std::vector<int>& balance, RelaxedRows* rows,
                                       std::shared_ptr<const MinMaxShareProgramme>* final,
                                       std::shared_ptr<RootPaths>* kept_paths) const {
  std::vector<double> layer_work(layers_);
  for (int x = 0; x < layers_; ++x) layer_work[x] = work_[x + 1] - work_[x];
  const RatioClasses classes =
      ratio_classes(layer_work, *first_size_, max_ratio_classes(stages_), ClassSplit::LeastLoss);
  const int n_classes = static_cast<int>(classes.work.size());
  auto paths = std::make_shared<RootPaths>(*first_size_, *last_size_, classes, layer_work, stages_);
  ClassRatio trip_first, trip_last;
  const std::vector<RootCase> cases = root_cases(classes, layer_work, trip_first, trip_last);
  RelaxedRows own_rows;
  root_wait_rows(*paths, cases, trip_first, trip_last, own_rows);
  MinMaxShareProgramme programme(stages_, classes.work);
  for (std::size_t i = 0; i < own_rows.constant.size(); ++i)
    programme.add(own_rows.constant[i], own_rows.slope[i]);
  std::vector<double> shares;
  // Each stage end on the hull of what a run of layers holds (ContiguityHull): without it a
  // stage whose backwards are on the critical path takes the layers whose backwards are light,
  // and another stage the rest.
  ContiguityHull hull(layer_work, classes);
  double bound = root_cutting_planes(programme, *paths, hull, own_rows, shares);
  if (rows != nullptr) *rows = {own_rows.constant, own_rows.slope, classes.work, classes.of};
  if (final != nullptr) {
    std::vector<double> weights, kept_shares;
    programme.solve(&kept_shares, &weights);
    std::vector<bool> keep(weights.size());
    for (std::size_t i = 0; i < weights.size(); ++i) keep[i] = weights[i] > 0.0;
    *final = std::make_shared<MinMaxShareProgramme>(programme.with_functions(keep));
  }
  if (kept_paths != nullptr) *kept_paths = paths;
  if (heaviest_layer_matters(layer_work, stages_)) {
    // On the rows alone: the hull's constraints made each of its per-stage solves several
    // times dearer (40 layers on 32 unequal devices: 2.5 s of them in 30 roots, from 1.6 s),
    // for roots within 0.3 % of these on the random instances.
    MinMaxShareProgramme rows_only(stages_, classes.work);
    for (std::size_t i = 0; i < own_rows.constant.size(); ++i)
      rows_only.add(own_rows.constant[i], own_rows.slope[i]);
    std::vector<double> rows_shares;
    rows_only.solve(&rows_shares);
    bound = std::max(
        bound, heaviest_layer_bound(rows_only, layer_work, classes, stages_, rows_shares, bound));
  }
  // The shares' plan, rounded to layer boundaries: a first plan near the bound.
  std::vector<double> stage_share(stages_, 0.0);
  for (int k = 0; k < stages_; ++k)
    for (int x = 0; x < n_classes; ++x) stage_share[k] += shares[x * stages_ + k];
  balance = rounded_balance(work_, stage_share);
  return std::max(0.0, bound * (1.0 - 1e-12));
}

std::vector<std::vector<double>> SingleStageSearch::class_work_before(
    const std::vector<int>& class_of, int classes) const {
  std::vector<std::vector<double>> before(classes, std::vector<double>(layers_ + 1, 0.0));
  for (int t = 0; t < layers_; ++t) {
    for (int c = 0; c < classes; ++c) before[c][t + 1] = before[c][t];
    before[class_of[t]][t + 1] += work_[t + 1] - work_[t];
  }
  return before;
}

// A node of capped_root()'s search: the intervals of the stage ends, its bound, the shares'
// ends (in layers, continuous) and its solved programme, which a child copies and adds the
// constraints of the ends its narrowing moved to, going on from this basis (a fresh programme
// costs O(rows^2) a function and a solve from the slacks).
struct SingleStageSearch::CappedNode {
  double value;
  std::vector<int> lo, hi;  // per end 0..K (0 and K fixed)
  std::vector<double> at;
  std::shared_ptr<const MinMaxShareProgramme> programme;
  bool operator>(const CappedNode& o) const { return value > o.value; }
};

// The furthest end of stage j from start a that may fit its device's cap.
int SingleStageSearch::furthest_fitting_end(int j, int a) const {
  return fit_end_[j].empty() ? layers_ : fit_end_[j][std::min(a, layers_ - 1)];
}

// The ends' intervals of a capped_root() node narrowed until consistent: stage j starting at its
// latest start reaches at most furthest_fitting_end() of it; starting at its earliest, it must
// reach the next end. False where no balance has its ends in them.
bool SingleStageSearch::narrow_ends(std::vector<int>& lo, std::vector<int>& hi) const {
  for (bool changed = true; changed;) {
    changed = false;
    for (int j = 0; j < stages_; ++j) {
      auto lower_to = [&](int& v, int to) {
        if (to < v) v = to, changed = true;
      };
      auto raise_to = [&](int& v, int to) {
        if (to > v) v = to, changed = true;
      };
      if (lo[j] > hi[j] || lo[j] >= layers_) return false;
      lower_to(hi[j + 1], furthest_fitting_end(j, hi[j]));
      raise_to(lo[j + 1], lo[j] + 1);
      lower_to(hi[j], hi[j + 1] - 1);
      int a = lo[j];
      while (a <= hi[j] && furthest_fitting_end(j, a) < lo[j + 1]) ++a;
      raise_to(lo[j], a);
    }
    for (int j = 0; j <= stages_; ++j)
      if (lo[j] > hi[j]) return false;
  }
  return lo[0] == 0 && hi[stages_] == layers_;
}

// A capped_root() node's bound: the relaxed root's programme (`rows`) with every class's work
// before end j kept between its work before lo_j and before hi_j (`before`), and its shares'
// ends. `parent`: the node it was split from (its programme solved, which this one copies and
// goes on from), or none for the root.
void SingleStageSearch::solve_capped_node(CappedNode& node, const CappedNode* parent,
                                          const RelaxedRows& rows,
                                          const std::vector<std::vector<double>>& before) {
  const int n_classes = static_cast<int>(rows.totals.size());
  auto programme = parent ? std::make_shared<MinMaxShareProgramme>(*parent->programme)
                          : std::make_shared<MinMaxShareProgramme>(
                                static_cast<std::size_t>(stages_), rows.totals);
  const std::uint64_t cells = programme->pivot_cells();
  if (parent) {
    context_.stats.steps += programme->tableau_cells() / kPivotCellsPerStep;  // the copy
  } else {
    for (std::size_t i = 0; i < rows.constant.size(); ++i)
      programme->add(rows.constant[i], rows.slope[i]);
  }
  for (int j = 1; j < stages_; ++j) {
    // Only what is tighter than the parent's (its constraints hold here too).
    const bool low = node.lo[j] > (parent ? parent->lo[j] : j);
    const bool high = node.hi[j] < (parent ? parent->hi[j] : layers_ - (stages_ - j));
    for (int c = 0; c < n_classes && (low || high); ++c) {
      std::vector<double> a(static_cast<std::size_t>(n_classes) * stages_, 0.0);
      for (int s = 0; s < j; ++s) a[c * stages_ + s] = 1.0;
      if (low) programme->add_constraint(a, before[c][node.lo[j]]);
      for (double& v : a) v = -v;
      if (high) programme->add_constraint(a, -before[c][node.hi[j]]);
    }
  }
  std::vector<double> shares;
  node.value = std::max(node.value, programme->solve(&shares));
  if (parent) {
    context_.stats.steps += (programme->pivot_cells() - cells) / kPivotCellsPerStep;
  } else {
    // The root's programme built afresh (measured: four steps per tableau cell; the
    // constraints' columns count as functions).
    const std::uint64_t columns =
        programme->functions() + 2 * static_cast<std::uint64_t>(n_classes) * stages_;
    context_.stats.steps += 4 * columns * static_cast<std::uint64_t>(n_classes * stages_ + 1);
  }
  node.programme = std::move(programme);
  node.at.assign(stages_ + 1, 0.0);
  double work = 0.0;
  for (int j = 1; j <= stages_; ++j) {
    for (int c = 0; c < n_classes; ++c) work += shares[c * stages_ + j - 1];
    const auto t = std::lower_bound(work_.begin(), work_.end(), work);
    const int x = std::clamp(static_cast<int>(t - work_.begin()), 1, layers_);
    const double span = work_[x] - work_[x - 1];
    node.at[j] = x - 1 + (span > 0.0 ? std::clamp((work - work_[x - 1]) / span, 0.0, 1.0) : 1.0);
  }
}

// The relaxed root under the memory caps. The relaxed root shares the work continuously and
// knows nothing of the caps, which decide where the stage ends may go when a few layers hold
// most of a stage's memory. A stage that fits passes its nested memory bound, so it ends at
// most at fit_end_[j][its start], which only grows with the start. This searches intervals
// [lo_j, hi_j] of the ends, best-first: each node's intervals are narrowed until consistent
// (stage j starting at its latest start reaches at most fit_end_ of it; starting at its
// earliest, it must reach the next end), then its bound is the relaxed root's programme with
// every class's work before end j kept between that class's work before lo_j and before hi_j
// (true of every balance whose ends lie in the intervals). Where the programme's shares put a
// stage over what fits, the wider of its two ends is split at the shares' position. The
// children cover their parent, so the least bound over the open nodes bounds every balance
// that fits; it stops when that node's shares fit as they are, when it reaches `threshold`,
// after kCappedRootNodes nodes, or at `step_limit`: only then is `finished` false (the caller
// runs it again with a larger allowance).
double SingleStageSearch::capped_root(const RelaxedRows& rows, double threshold,
                                      std::uint64_t step_limit, bool& finished) {
  finished = true;
  const int k_stages = stages_, n_classes = static_cast<int>(rows.totals.size());
  const std::vector<std::vector<double>> before = class_work_before(rows.class_of, n_classes);
  CappedNode root{0.0, std::vector<int>(k_stages + 1), std::vector<int>(k_stages + 1), {}, {}};
  for (int j = 0; j <= k_stages; ++j) {
    root.lo[j] = j;
    root.hi[j] = layers_ - (k_stages - j);
  }
  root.hi[0] = 0;
  root.lo[k_stages] = layers_;
  if (!narrow_ends(root.lo, root.hi)) return kInf;  // no balance passes the nested memory bounds
  solve_capped_node(root, nullptr, rows, before);
  std::priority_queue<CappedNode, std::vector<CappedNode>, std::greater<>> open;
  open.push(std::move(root));
  for (int expanded = 0; expanded < kCappedRootNodes; ++expanded) {
    if (open.empty()) return kInf;
    if (open.top().value >= threshold) break;
    if (context_.stats.steps >= step_limit) {
      finished = false;
      break;
    }
    CappedNode node = open.top();
    open.pop();
    // The stage the shares put furthest over what fits, and the wider of its ends.
    int over = -1, most = 0;
    for (int j = 0; j < k_stages; ++j) {
      const int a = std::clamp(static_cast<int>(std::lround(node.at[j])), node.lo[j], node.hi[j]);
      const int b =
          std::clamp(static_cast<int>(std::lround(node.at[j + 1])), node.lo[j + 1], node.hi[j + 1]);
      if (a < layers_ && b - furthest_fitting_end(j, a) > most)
        most = b - furthest_fitting_end(j, a), over = j;
    }
    if (over < 0) {
      open.push(std::move(node));  // consistent: splitting it would not see the caps
      break;
    }
    int end = -1;
    for (int j : {over, over + 1}) {
      if (j == 0 || j == k_stages || node.lo[j] == node.hi[j]) continue;
      if (end < 0 || node.hi[j] - node.lo[j] > node.hi[end] - node.lo[end]) end = j;
    }
    if (end < 0) continue;  // both ends fixed and still over: nothing of it fits (narrow missed it)
    const int split =
        std::clamp(static_cast<int>(std::lround(node.at[end])), node.lo[end], node.hi[end] - 1);
    for (const auto& [from, to] :
         {std::pair{node.lo[end], split}, std::pair{split + 1, node.hi[end]}}) {
      CappedNode child{node.value, node.lo, node.hi, {}, {}};
      child.lo[end] = from;
      child.hi[end] = to;
      if (!narrow_ends(child.lo, child.hi)) continue;
      solve_capped_node(child, &node, rows, before);
      open.push(std::move(child));
    }
  }
  // A hair below, as the relaxed root: rounding never rules out a plan as long as the bound.
  return open.empty() ? kInf : open.top().value * (1.0 - 1e-12);
}

// The root bound with 1F1B's round trips waiting, on the last stage, for their recomputes
// (tests/sim/planner/stage_timing_test.cpp checks that wait against the simulator). The last
// stage's layers are unknown, so for a threshold T: if a balance had every stage's chained_cost()
// and wait_cost() below T, its last stage would start no later than c = furthest_last_start(), so
// it would hold [c, L) and each round trip would wait at least for the recompute of [c, L); if even
// with that the stages cannot stay below T, no balance can, and T is a bound. Bisection finds the
// largest such T up to `ceiling`.
double SingleStageSearch::recompute_root(double root, double ceiling) const {
  const Config& c = *config_;
  const int m = c.micro_batches();
  if (c.schedule != ScheduleKind::OneFOneB || !c.recomputed(0) || stages_ < 2) return root;
  const int last = stages_ - 1;
  auto stage_cost = [&](int j, int a, int b, double r_first, double r_q, double r_pass) {
    if (!fits_nested(j, a, b)) return kInf;
    return std::max(chained_cost(j, a, b, r_pass), wait_cost(j, a, b, r_first, r_q));
  };
  // The furthest start of the last stage, or -1 when even that stage is not below `limit`.
  auto furthest = [&](double limit, double r_first, double r_q, double r_pass) {
    const int start = furthest_last_start(0, last, 0, layers_, limit, [&](int j, int a, int b) {
      return stage_cost(j, a, b, r_first, r_q, r_pass);
    });
    return stage_cost(last, start, layers_, 0.0, 0.0, 0.0) < limit ? start : -1;
  };
  const SizeCosts& q_size = followed_ == m - 1 ? *last_size_ : *first_size_;
  auto ruled_out = [&](double limit) {
    const int start = furthest(limit, 0.0, 0.0, 0.0);
    if (start < 0) return true;
    const double r_first = forward(*first_size_, last, start, layers_);
    const double r_q = c.recomputed(followed_) ? forward(q_size, last, start, layers_) : 0.0;
    // chained_cost follows the last full-size micro-batch and micro-batch 0 (pass_filler).
    const int p = m >= 2 && c.sizes.back() != c.sizes.front() ? m - 2 : m - 1;
    const double r_pass = c.recomputed(p) ? r_first : 0.0;
    return furthest(limit, r_first, r_q, r_pass) < 0;
  };
  if (!(ceiling > root)) return root;
  if (ruled_out(ceiling)) return ceiling;
  double lo = root, hi = ceiling;  // lo: ruled out (a bound), hi: not
  for (int step = 0; step < 16 && hi - lo > 1e-6 * hi; ++step) {
    const double mid = 0.5 * (lo + hi);
    (ruled_out(mid) ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace pipetune::planning
