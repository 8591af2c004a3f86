// The multi-stage relaxed roots: every path of a schedule's task graph bounded over continuous
// shares of the work, by cutting planes.

#include <algorithm>
#include <cmath>
#include <numeric>

#include "sim/planner/multi_stage_search.hpp"
#include "sim/task_graph.hpp"

namespace pipetune::planning {

// The relaxed root of a multi-stage configuration (docs/planner.md): each stage s gets a share
// x_s of the work (LayerWork), every task is bounded by its least ratio to a layer's work
// over its stage's share (plus its overhead; a copy by the least bytes a boundary can carry),
// and the plan is at least every path of its task graph, which depends on the schedule alone,
// not on the balance. Rows: each device's busy time, then (cutting planes) long paths of model
// plans (first the last root's best model plan of the same schedule and stages per device, or
// equal time per stage; then each a step from the best model plan towards the solve's shares,
// and the shares themselves where the step's paths are not above the bound), timed by a
// sweep, until no path of the solve's shares is timed longer than the bound, then on with the
// paths' own rows (above their timed lengths, see add_paths) until none of those is above it
// either, or until the bound reaches `enough`. `rows`, where given, receives the programme's
// functions. `complete`: whether the rounds ended by themselves (no path longer, all of them run,
// or `enough`) rather than at `step_limit`, a count of context_.stats.steps; while they did not,
// `state` holds where they stopped, for a later call to go on from (a fresh start each time never
// completed a root that needs more than the steps given). `balances`: the best model plan timed and
// the last solve's shares (once a round has run), and the two where no path was timed above the
// bound any more, each rounded to layer boundaries (on random models each was the better start for
// the local search on some). One call of multi_stage_relaxed_root(): the configuration's task graph
// and the layers' costs as the rows price them, and the model plans' timing and paths. The state
// that outlives the call (the programme, the model plans) is the RelaxedRootState it works on.
class MultiStageSearch::MultiStageRoot {
 public:
  using Counts = std::vector<std::array<int, 14>>;  // [stage][kind * 2 + slot]

  MultiStageRoot(MultiStageSearch& search, const Config& c, const LayerWork& layer_work,
                 std::unique_ptr<RelaxedRootState>& state);
  // A fresh root's first rows (each device's busy time), its first solve and first model plan.
  void start();
  // Orders the graph's tasks for the model plans' sweeps.
  void prepare_sweeps();
  // The cutting-plane rounds until `step_limit` or a bound of `enough`; false where cut short.
  bool run_rounds(std::uint64_t step_limit, double enough);
  // As returned: a hair below, and the configuration closes only on the value returned.
  static bool reaches(double bound, double enough) { return bound * (1.0 - 1e-12) >= enough; }

  MultiStageSearch& search;
  const Config& c;
  const std::vector<double>& work;
  const int v, m, stages;
  const std::vector<int> device_of;
  TaskGraph graph;
  const SizeCosts* size_of[2];
  std::vector<int> slot_of;
  const RatioClasses& classes;
  int n_classes;
  std::array<std::vector<double>, 14> cost;  // [kind * 2 + slot][layer]
  double least_bytes[2];
  std::array<ClassRatio, 14> ratio;  // per task: its least cost per unit of work, per class
  const std::vector<double>* ascending[2];
  std::size_t width;
  bool fresh;
  RelaxedRootState& st;
  RootProgramme& programme;
  TaskOrder sorted;
  std::vector<double> duration, start_at, finish;

 private:
  int kind_of(const SimTask& t) const;
  double copy_ms(const SimTask& t) const;
  void count_task(Counts& counts, const SimTask& t) const {
    ++counts[t.stage][kind_of(t) * 2 + slot_of[t.micro_batch]];
  }
  std::vector<double> slopes(const Counts& counts);
  void charge(std::uint64_t cells_before) {
    search.context_.stats.steps +=
        (programme.pivot_cells() - cells_before) / kRootPivotCellsPerStep;
  }
  double time_model_plan(const std::vector<double>& plan);
  int add_paths(const std::vector<double>& plan, int count);
  int add_hull_cuts();
  bool add_path_from(int at, const std::vector<double>& plan);
};

MultiStageSearch::MultiStageRoot::MultiStageRoot(MultiStageSearch& s, const Config& config,
                                                 const LayerWork& layer_work,
                                                 std::unique_ptr<RelaxedRootState>& state)
    : search(s),
      c(config),
      work(layer_work.each),
      v(config.stages_per_device),
      m(config.micro_batches()),
      stages(s.context_.stage_count(config)),
      device_of(s.context_.stage_devices_of(config)),
      size_of{&s.context_.costs.at(config.sizes.front()),
              &s.context_.costs.at(config.sizes.back())},
      slot_of(m),
      classes(s.root_classes(config, layer_work, stages).classes),
      n_classes(static_cast<int>(classes.work.size())),
      least_bytes{least_boundary_bytes(*size_of[0]), least_boundary_bytes(*size_of[1])},
      ascending{&s.context_.boundary_bytes_ascending(*size_of[0]),
                &s.context_.boundary_bytes_ascending(*size_of[1])},
      width(static_cast<std::size_t>(n_classes) * stages),
      fresh(!state),
      st(fresh ? *(state = std::make_unique<RelaxedRootState>(
                       stages, classes.work,
                       2 * static_cast<std::size_t>(s.stages_ + kRelaxedRootRounds)))
               : *state),
      programme(st.programme) {
  build_task_graph(graph, make_schedule(c.schedule, stages, m, c.checkpoint, v), device_of,
                   s.stages_);
  for (int i = 0; i < m; ++i) slot_of[i] = c.sizes[i] == c.sizes.front() ? 0 : 1;
  // A task's cost on each layer; kinds as TaskKind, with the forward without autograd at
  // SendActivation's place (no copy needs one).
  for (int slot = 0; slot < 2; ++slot) {
    const SizeCosts& sc = *size_of[slot];
    const std::vector<double>* per[7] = {
        &sc.forward_ms, &sc.forward_ms,        &sc.backward_ms,       &sc.forward_nograd_ms,
        nullptr,        &sc.backward_input_ms, &sc.backward_weight_ms};
    for (int kind = 0; kind < 7; ++kind)
      cost[kind * 2 + slot] = per[kind] ? *per[kind] : std::vector<double>(s.layers_, 0.0);
  }
  for (int x = 0; x < 14; ++x) {
    ratio[x] = ClassRatio(n_classes);
    for (int k = 0; k < s.layers_; ++k) ratio[x].add(classes.of[k], cost[x][k], work[k]);
  }
  if (fresh) st.hull = s.root_classes(config, layer_work, stages).hull;
}

// Classes of equal ranges, as many as the single-stage roots take for as many stages (more where
// there are few stages; with the hull's cuts, see run_rounds()). The least-loss split, tried
// here, moved the every-schedule answers of random instances by up to 5 % either way (their
// searches are cut short by the budget), none better on the whole.
const MultiStageSearch::RootClasses& MultiStageSearch::root_classes(const Config& c,
                                                                    const LayerWork& work,
                                                                    int stages) {
  const int most = max_ratio_classes(stages);
  std::unique_ptr<const RootClasses>& kept = root_classes_[{c.sizes, most}];
  if (!kept) {
    RatioClasses classes =
        ratio_classes(work.each, context_.costs.at(c.sizes.front()), most, ClassSplit::EqualRanges);
    ContiguityHull hull(work.each, classes);
    kept = std::make_unique<const RootClasses>(RootClasses{std::move(classes), std::move(hull)});
  }
  return *kept;
}

int MultiStageSearch::MultiStageRoot::kind_of(const SimTask& t) const {
  if (t.kind == TaskKind::Forward && graph.schedule.recomputes(t.micro_batch))
    return static_cast<int>(TaskKind::SendActivation);
  // An I of no work (SendGradient's place holds none), W the whole backward.
  if (whole_backward_at_weight(search.context_.hardware.runtime, t.stage)) {
    if (t.kind == TaskKind::InputGrad) return static_cast<int>(TaskKind::SendGradient);
    if (t.kind == TaskKind::WeightGrad) return static_cast<int>(TaskKind::Backward);
  }
  return static_cast<int>(t.kind);
}

double MultiStageSearch::MultiStageRoot::copy_ms(const SimTask& t) const {
  // A gradient into a frozen stem carries no byte (CostModel::input_needs_gradient).
  const bool may_be_empty = t.kind == TaskKind::SendGradient && search.context_.costs.has_frozen();
  const double bytes = may_be_empty ? 0.0 : least_bytes[slot_of[t.micro_batch]];
  return bytes < kInf ? search.context_.hardware.link_between(t.device, t.peer).transfer_ms(bytes)
                      : 0.0;
}

// A row's compute tasks, counted per stage, kind and slot; their least time as slopes on the
// stages' shares, one block per class: per stage, the least over a class's layers of what those
// tasks cost on the layer against its work (tighter than a least ratio per task when a
// backward's halves vary unlike each other from layer to layer). A stage's least ratios depend
// on its counts alone, and paths cross many stages with the same counts (a forward and a
// backward of one micro-batch): each count vector is walked over the layers once (that walk was
// most of the root's time).
std::vector<double> MultiStageSearch::MultiStageRoot::slopes(const Counts& counts) {
  std::vector<double> row(width, 0.0);
  for (int s = 0; s < stages; ++s) {
    const std::array<int, 14>& n = counts[s];
    if (std::all_of(n.begin(), n.end(), [](int x) { return x == 0; })) continue;
    auto [it, added] = st.least_of_counts.try_emplace(n);
    if (added) {
      it->second = joint_least_ratios(
          n, [&](int x, int k) { return cost[x][k]; }, classes, work);
    }
    for (int k = 0; k < n_classes; ++k)
      row[k * stages + s] = it->second[k] / search.speed_[device_of[s]];
  }
  return row;
}

void MultiStageSearch::MultiStageRoot::start() {
  std::vector<Counts> busy(search.stages_, Counts(stages));
  std::vector<double> tasks(search.stages_, 0.0);
  for (const SimTask& t : graph.tasks) {
    if (!is_compute(t.kind)) continue;
    count_task(busy[t.device], t);
    tasks[t.device] += search.overhead_;
  }
  for (int r = 0; r < search.stages_; ++r) programme.add(tasks[r], slopes(busy[r]));
  st.bound = st.last_value = programme.solve(&st.shares, &st.weights);
  charge(0);
  // The first model plan gives each stage the same time on its device, whatever the solve's
  // shares (the busy rows alone leave them arbitrary, and the first rounds' paths from such
  // extreme plans raised nothing: 9 rounds without a gain on 1,000 layers x 32 stages); or,
  // where a root of the same schedule ran before, that root's best model plan, stage by stage:
  // configurations of one schedule want much the same balance, and the rounds start nearer it.
  st.model_plan.assign(st.shares.size(), 0.0);
  std::vector<double> share = search.equal_time_shares(c);
  if (auto it = search.model_start_.find({c.schedule, v}); it != search.model_start_.end())
    share = it->second;
  for (int k = 0; k < n_classes; ++k)
    for (int s = 0; s < stages; ++s) st.model_plan[k * stages + s] = classes.work[k] * share[s];
  st.best_plan = st.model_plan;
}

// Every resource runs its tasks in a fixed order and no task is paced, so a model plan's times
// are the longest paths over the engine's edges: a sweep in topological order, several times
// faster than the event queue (which was most of the root's time).
void MultiStageSearch::MultiStageRoot::prepare_sweeps() {
  search.context_.stats.steps += 1 + graph.tasks.size() / kSweepTasksPerStep;
  sorted = topological_order(graph);
  duration.assign(graph.tasks.size(), 0.0);
  start_at.assign(graph.tasks.size(), 0.0);
  finish.assign(graph.tasks.size(), 0.0);
}

// A model plan's makespan (start_at and finish hold its tasks' times); the best so far is kept.
double MultiStageSearch::MultiStageRoot::time_model_plan(const std::vector<double>& plan) {
  search.context_.stats.steps += 1 + graph.tasks.size() / kSweepTasksPerStep;
  for (std::size_t id = 0; id < graph.tasks.size(); ++id) {
    const SimTask& t = graph.tasks[id];
    double ms = 0.0;
    if (is_compute(t.kind)) {
      const ClassRatio& r = ratio[kind_of(t) * 2 + slot_of[t.micro_batch]];
      ms = search.overhead_;
      for (int k = 0; k < n_classes; ++k)
        ms += r.lower(k) * plan[k * stages + t.stage] / search.speed_[t.device];
    } else {
      ms = copy_ms(t);
    }
    duration[id] = ms;
  }
  double makespan = 0.0;
  for (int id : sorted.order) {
    double at = 0.0;
    for (int u : sorted.predecessors(id)) at = std::max(at, finish[u]);
    start_at[id] = at;
    finish[id] = at + duration[id];
    makespan = std::max(makespan, finish[id]);
  }
  if (makespan < st.best_plan_ms) {
    st.best_plan_ms = makespan;
    st.best_plan = plan;
  }
  return makespan;
}

// The row of the path back from task `at` of the plan last timed, each time to a predecessor
// that ended as it started; added (true) where its value, at `plan` or at the last solve's
// shares, is above the bound and the programme lacks it: the row prices a stage's tasks
// together at their joint least ratio, above the sum of their least ratios that the timing
// takes, so a plan timed below the bound may still have rows above it.
bool MultiStageSearch::MultiStageRoot::add_path_from(int at, const std::vector<double>& plan) {
  auto value_at = [&](double constant, const std::vector<double>& slope,
                      const std::vector<double>& shares) {
    if (shares.size() != slope.size()) return 0.0;
    double value = constant;
    for (std::size_t x = 0; x < slope.size(); ++x) value += slope[x] * shares[x];
    return value;
  };
  double constant = 0.0;
  Counts on_path(stages);
  // Its copies at distinct outputs: their latencies and their bytes by boundary (a gradient
  // crosses its sender's lower one), priced together below.
  double copies_at_least = 0.0, latencies = 0.0;
  std::array<std::vector<double>, 2> per_byte;
  for (auto& w : per_byte) w.assign(stages, 0.0);
  while (at >= 0) {
    const SimTask& t = graph.tasks[at];
    if (is_compute(t.kind)) {
      count_task(on_path, t);
      constant += search.overhead_;
    } else {
      const double at_least = copy_ms(t);
      constant += at_least;
      copies_at_least += at_least;
      const Link& link = search.context_.hardware.link_between(t.device, t.peer);
      latencies += link.transfer_ms(0.0);
      const int boundary = t.kind == TaskKind::SendActivation ? t.stage : t.stage - 1;
      per_byte[slot_of[t.micro_batch]][boundary] += ms_per_byte(link);
    }
    int next = -1;
    for (int u : sorted.predecessors(at)) {
      if (finish[u] >= start_at[at]) next = u;
    }
    at = start_at[at] > 0.0 ? next : -1;
  }
  std::vector<double> slope = slopes(on_path);
  std::uint64_t& steps = search.context_.stats.steps;
  steps += 1 + 2 * width / kPivotCellsPerStep;
  const double above = st.bound * (1.0 + 1e-9);
  if (!(value_at(constant, slope, plan) > above) &&
      !(st.rounds > 0 && value_at(constant, slope, st.shares) > above))
    return false;
  bool known = false;
  for (std::size_t i = 0; i < programme.functions() && !known; ++i)
    known = programme.constant(i) == constant && programme.slope(i) == slope;
  steps += programme.functions() * width / kPivotCellsPerStep;
  if (known) return false;
  st.copy_excess.resize(programme.functions(), 0.0);
  st.copy_excess.push_back(
      std::max(0.0, latencies + least_boundary_copies_ms(per_byte[0], *ascending[0]) +
                        least_boundary_copies_ms(per_byte[1], *ascending[1]) - copies_at_least));
  programme.add(constant, std::move(slope));
  steps += (width + 1) * (width + 1) / kPivotCellsPerStep;  // the column's pricing
  return true;
}

// Rows per path of `plan`, the plan last timed (add_path_from()): from the task that ends last
// and from the last tasks of the devices that end next, `count` of them (two rows a round gave
// 1,000 layers on 32 stages a root 4 % higher in the same 40 rounds than one; the first round
// takes every device's). Returns the rows added.
int MultiStageSearch::MultiStageRoot::add_paths(const std::vector<double>& plan, int count) {
  std::vector<int> last(search.stages_, -1);
  for (int id = 0; id < static_cast<int>(graph.tasks.size()); ++id) {
    int& l = last[graph.tasks[id].device];
    if (l < 0 || finish[id] > finish[l]) l = id;
  }
  std::erase_if(last, [&](int id) {
    return id < 0 || (st.by_timing && !(finish[id] > st.bound * (1.0 + 1e-9)));
  });
  std::sort(last.begin(), last.end(), [&](int x, int y) { return finish[x] > finish[y]; });
  if (static_cast<int>(last.size()) > count) last.resize(count);
  int added = 0;
  for (int at : last) added += add_path_from(at, plan) ? 1 : 0;
  return added;
}

// The contiguity hull's cuts the last solve's shares cross (ContiguityHull), charged as the
// rows they add; returns how many.
int MultiStageSearch::MultiStageRoot::add_hull_cuts() {
  const std::uint64_t cells = programme.pivot_cells();
  search.context_.stats.steps += 1 + width / kPivotCellsPerStep;
  const int added = st.hull->add_crossed(programme, st.shares, stages);
  charge(cells);
  return added;
}

bool MultiStageSearch::MultiStageRoot::run_rounds(std::uint64_t step_limit, double enough) {
  for (; st.rounds < kRelaxedRootRounds && !reaches(st.bound, enough); ++st.rounds) {
    if (search.context_.stats.steps >= step_limit) return false;
    time_model_plan(st.model_plan);
    if (add_paths(st.model_plan, st.rounds == 0 ? search.stages_ : 2) == 0) {
      // No row of the stepped plan's paths is above the bound, which says nothing of the
      // solve's vertex: its own paths then (Kelley's cut), and where none of theirs is above
      // the bound either, the rounds are done. (Ending on the stepped plan alone, a 120-layer
      // configuration on 2 devices stopped after one round at 283.367 ms against 291.784.)
      time_model_plan(st.shares);
      if (add_paths(st.shares, 2) == 0) {
        if (st.by_timing) {
          // No path is timed above the bound: the rows of the paths themselves from now on,
          // and the plans here kept as starts (the rounds after them move the model plans,
          // and the local search from those alone ended up to 2.5 % slower on random
          // instances).
          st.by_timing = false;
          st.timed_plans = {st.best_plan};
          // (Before the first solve the shares are the busy rows' arbitrary vertex.)
          if (st.rounds > 0) st.timed_plans.push_back(st.shares);
          continue;
        }
        // No path's row is above the bound either: the hull's edges the shares cross (stage
        // ends that no run of layers has), and where there are none the rounds are done.
        const bool first_cuts = st.unhulled.empty();
        if (add_hull_cuts() == 0) break;
        // The plans the rounds would have ended on without the hull stay the first starts.
        if (first_cuts) st.unhulled = {st.best_plan, st.shares};
      }
    }
    const std::uint64_t cells = programme.pivot_cells();
    st.last_value = programme.solve(&st.shares, &st.weights);
    st.bound = std::max(st.bound, st.last_value);
    charge(cells);
    // Not the solve's shares but a step from the best model plan towards them (Kelley's method
    // stabilised): the shares jump between far vertices, whose paths raise the bound little.
    // On bench's capped 1,000-layer profile, x12 except_last interleaved-1f1b, 40 rounds took
    // the bound to 1841 ms with the shares and to 1876 with a step of 0.3 (its best plan:
    // about 1905).
    st.model_plan.resize(st.shares.size());
    for (std::size_t x = 0; x < st.model_plan.size(); ++x)
      st.model_plan[x] = kModelPlanStep * st.shares[x] + (1.0 - kModelPlanStep) * st.best_plan[x];
  }
  return true;
}

double MultiStageSearch::multi_stage_relaxed_root(const Config& c, const LayerWork& layer_work,
                                                  std::uint64_t step_limit, double enough,
                                                  std::unique_ptr<RelaxedRootState>& state,
                                                  bool* complete,
                                                  std::vector<std::vector<int>>* balances,
                                                  StageWorkRows* rows, double* copies_bound) {
  MultiStageRoot root(*this, c, layer_work, state);
  RelaxedRootState& st = root.st;
  // The rounds count against the budget (their pivots, columns and sweeps) and stop at
  // `step_limit`, the bound so far standing, or once the bound reaches `enough`.
  if (root.fresh) root.start();
  root.prepare_sweeps();
  *complete = false;
  const bool cut = !root.run_rounds(step_limit, enough);
  double bound = st.bound;
  if (!cut) {
    if (!MultiStageRoot::reaches(bound, enough)) {
      std::uint64_t cells = 0;
      bound = std::max(bound, heaviest_layer_bound(st.programme, root.work, root.classes,
                                                   root.stages, st.shares, bound, &cells));
      context_.stats.steps += cells / kRootPivotCellsPerStep;
    }
    *complete = true;
  }
  keep_root_plans(root, layer_work, *balances);
  if (rows != nullptr) root_rows(root, *rows);
  if (copies_bound != nullptr && !st.weights.empty()) {
    // The last solve's weights are a feasible dual: with each function's constant raised by
    // its copy excess, they bound every balance by their value plus the weighted excesses.
    double raised = st.last_value;
    for (std::size_t i = 0; i < std::min(st.weights.size(), st.copy_excess.size()); ++i)
      raised += st.weights[i] * st.copy_excess[i];
    *copies_bound = std::max(*copies_bound, std::max(0.0, raised * (1.0 - 1e-12)));
  }
  if (*complete) state.reset();
  return std::max(0.0, bound * (1.0 - 1e-12));
}

// The root's plans rounded to layer boundaries as starts for the local search (`balances`): the
// best model plan timed, the last solve's shares (once a round has run), and the two where no
// path was timed above the bound any more (on random models each was the better start on
// some). The next root of this schedule starts from its best model plan.
void MultiStageSearch::keep_root_plans(const MultiStageRoot& root, const LayerWork& layer_work,
                                       std::vector<std::vector<int>>& balances) {
  const RelaxedRootState& st = root.st;
  const int stages = root.stages, n_classes = root.n_classes;
  balances.clear();
  std::vector<const std::vector<double>*> plans;
  for (const std::vector<double>& plan : st.unhulled) plans.push_back(&plan);
  plans.push_back(&st.best_plan);
  // Before the first round the solve's shares are the busy rows' arbitrary vertex.
  if (st.rounds > 0) plans.push_back(&st.shares);
  for (const std::vector<double>& plan : st.timed_plans) plans.push_back(&plan);
  for (const std::vector<double>* shares : plans) {
    std::vector<double> stage_share(stages, 0.0);
    for (int s = 0; s < stages; ++s)
      for (int k = 0; k < n_classes; ++k) stage_share[s] += (*shares)[k * stages + s];
    std::vector<int> balance = rounded_balance(layer_work.prefix, stage_share);
    if (std::find(balances.begin(), balances.end(), balance) == balances.end())
      balances.push_back(std::move(balance));
  }
  if (st.rounds > 0) {
    std::vector<double> share(stages, 0.0);
    for (int k = 0; k < n_classes; ++k)
      for (int s = 0; s < stages; ++s) share[s] += st.best_plan[k * stages + s];
    const double sum = std::accumulate(share.begin(), share.end(), 0.0);
    if (sum > 0.0) {
      for (double& x : share) x /= sum;
      model_start_[{root.c.schedule, root.v}] = std::move(share);
    }
  }
}

// The root's programme as rows linear in each stage's work (for MultiStagePeakBound::may_fit()).
void MultiStageSearch::root_rows(const MultiStageRoot& root, StageWorkRows& rows) const {
  const RootProgramme& programme = root.programme;
  rows.layer_class = root.classes.of;
  rows.layer_work = root.work;
  rows.classes = root.n_classes;
  rows.constant.resize(programme.functions());
  rows.slope.resize(programme.functions());
  for (std::size_t i = 0; i < programme.functions(); ++i) {
    rows.constant[i] = programme.constant(i);
    rows.slope[i] = programme.slope(i);
  }
}

StageWorkRows MultiStageSearch::time_rows_of(const Plan& plan) {
  const Config c = context_.config_of(plan);
  const LayerWork work(context_.costs, c);
  std::unique_ptr<RelaxedRootState> state;
  bool complete = false;
  std::vector<std::vector<int>> balances;
  StageWorkRows rows;
  multi_stage_relaxed_root(c, work, std::numeric_limits<std::uint64_t>::max(), kInf, state,
                           &complete, &balances, &rows);
  return rows;
}

double MultiStageSearch::configuration_bound_of(const Plan& plan) const {
  return bound(context_.config_of(plan), /*at_the_end=*/true);
}

// The cheap pass: under caps, the memory relaxation (MultiStagePeakBound::may_fit()); the
// relaxed root, to a quarter of the budget; and the first plans (first_multi_stage_plans()),
// unless the cheap pass has spent half the budget.
void MultiStageSearch::open_root(Entry& e, double ranking_threshold) {
  const Config& c = *e.config;
  auto note = [&] {
    e.stats.best_ms = e.best < kInf ? e.best : 0.0;
    e.stats.lower_bound_ms = e.root;
  };
  if (e.root >= ranking_threshold) {
    e.closed = true;
    note();
    return;
  }
  // The memory relaxation and the first plans whatever the budget, while the cheap pass has
  // spent less than half of it (or 2^20 steps, so that a small budget still gets them); after
  // that in the configuration's first slice. A batch of 1,024 makes thousands of multi-stage
  // configurations: simulating all their first plans left nothing of the budget to search the
  // single-stage ones (3,000 layers on 4 devices: their proven best, 0.4 % faster, not found),
  // and their relaxations alone took 32 M steps of a 10 M budget (2,000 layers on 16 devices
  // under a cap, 6 s).
  const bool cheap_left =
      context_.stats.steps < std::max<std::uint64_t>(context_.options.search_budget / 2, 1 << 20);
  if (cheap_left && !fits_some_balance(e)) {
    e.closed = true;
    note();
    return;
  }
  // With 32 stages and a few classes a solve takes a few milliseconds, and a model of 64
  // samples has a few hundred configurations: in the cheap pass the rounds stop at a quarter
  // of the budget (at least about 50 ms of work, so that a small budget still gets the roots
  // of small models), so that the search for plans keeps the rest. Those cut short go on in
  // their configuration's slices (slice()); past half the budget a root does not
  // start here (its graph and first solve alone were 9.6 M steps over thousands of
  // configurations).
  const std::uint64_t allowance =
      std::max<std::uint64_t>(context_.options.search_budget / 4, 1 << 20);
  const LayerWork work(context_.costs, c);
  if (!cheap_left) {
    // Its first plans still start from equal time per stage, as the root's first round would.
    std::vector<double> stage_share = equal_time_shares(c);
    for (double& x : stage_share) x *= work.prefix[layers_];
    e.relaxed = {rounded_balance(work.prefix, stage_share)};
  } else {
    std::vector<std::vector<int>> relaxed;
    if (context_.capped()) e.time_rows = std::make_unique<StageWorkRows>();
    e.root = std::max(e.root, multi_stage_relaxed_root(c, work, allowance, ranking_threshold,
                                                       e.root_state, &e.root_complete, &relaxed,
                                                       e.time_rows.get(), &e.copies_root));
    if (e.root >= ranking_threshold || !fits_fast_enough(e, ranking_threshold)) {
      e.closed = true;
      note();
      return;
    }
    e.relaxed = std::move(relaxed);
  }
  if (cheap_left) first_multi_stage_plans(e, work);
  e.stats.evaluated = true;
  note();
}

}  // namespace pipetune::planning
