#include "sim/planner/multi_stage_peak_bound.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <stdexcept>

#include "sim/memory_model.hpp"
#include "sim/planner/minimax_bound.hpp"
#include "sim/planner/tuning.hpp"
#include "sim/schedule.hpp"

namespace pipetune {

namespace {

constexpr double kInfBytes = std::numeric_limits<double>::infinity();

// Whether every term of `a` is at most `b`'s.
template <typename Moment>
bool dominated(const Moment& a, const Moment& b) {
  if (a.constant > b.constant) return false;
  for (std::size_t j = 0; j < a.gradients.size(); ++j) {
    if (a.kept[0][j] > b.kept[0][j] || a.kept[1][j] > b.kept[1][j] ||
        a.waiting[0][j] > b.waiting[0][j] || a.waiting[1][j] > b.waiting[1][j] ||
        a.gradients[j] > b.gradients[j])
      return false;
  }
  return true;
}

// The balance a partition's table of starts leads to: from[s][b], the start of stage s where it
// ends at b on the least path.
std::vector<int> traced_balance(const std::vector<std::vector<int>>& from, int layers) {
  std::vector<int> balance(from.size());
  for (int s = static_cast<int>(from.size()) - 1, b = layers; s >= 0; --s) {
    const int a = from[s][b];
    balance[s] = b - a;
    b = a;
  }
  return balance;
}

}  // namespace

MultiStagePeakBound::MultiStagePeakBound(const CostModel& costs,
                                         const std::vector<std::int64_t>& sizes, ScheduleKind kind,
                                         CheckpointMode checkpoint, int devices,
                                         int stages_per_device, double optimizer_state_factor,
                                         std::vector<char> own_input)
    : costs_(costs),
      size_{&costs.at(sizes.front()), &costs.at(sizes.back())},
      stages_per_device_(stages_per_device),
      optimizer_state_factor_(optimizer_state_factor) {
  const int stages = devices * stages_per_device;
  for (int k = 0; k < costs.layer_count(); ++k) {
    if (!size_[0]->aliases[k]) continue;
    view_slack_ = std::max({view_slack_, size_[0]->output_bytes[k], size_[1]->output_bytes[k]});
  }
  rank_.assign(stages, 0);
  local_.assign(stages, 0);
  moments_.assign(devices, {});
  stages_of_.assign(devices, {});
  for (int s : {0, 1}) {
    kept_[s].assign(stages, 0);
    waiting_[s].assign(stages, 0);
    weight_kept_[s].assign(costs.layer_count() + 1, 0);
    for (int k = 0; k < costs.layer_count(); ++k)
      weight_kept_[s][k + 1] = weight_kept_[s][k] + weight_kept_last(s, k);
  }
  held_.assign(stages, 0);
  trained_.assign(stages, 0);
  collect_moments(sizes, kind, checkpoint);
  own_input_ = std::move(own_input);
  own_input_.resize(stages, 0);
}

std::vector<char> stage_inputs_own(const std::vector<int>& device_of_stage,
                                   const Hardware& hardware) {
  const std::vector<int> memory = device_memories(hardware);  // as the simulator's counters
  std::vector<char> out(device_of_stage.size(), 0);
  for (std::size_t t = 1; t < out.size(); ++t)
    out[t] = memory[device_of_stage[t - 1]] != memory[device_of_stage[t]];
  return out;
}

// Walks device r's programme once (its v stages' local indices in `local`), noting the state
// after every action: kept per slot, waiting per slot, gradients (v each), flat, which orders as
// the five vectors would one after another; each with the largest constant it had. Looked up
// before it is copied: the steady state repeats a few states, and a fresh key per action was
// most of the cost of building this bound (it is built for every multi-stage configuration).
std::map<std::vector<int>, std::int64_t> MultiStagePeakBound::device_states(
    const Schedule& schedule, int r, int v, const std::vector<std::int64_t>& sizes) const {
  const int stages = static_cast<int>(rank_.size());
  const int m = static_cast<int>(sizes.size());
  auto slot_of = [&](int i) { return sizes[i] == sizes.front() ? 0 : 1; };
  std::vector<int> now(5 * static_cast<std::size_t>(v), 0);
  auto kept_count = [&](int slot, int j) -> int& { return now[slot * v + j]; };
  auto waiting_count = [&](int slot, int j) -> int& { return now[(2 + slot) * v + j]; };
  std::int64_t constant = 0;
  std::vector<char> kept(static_cast<std::size_t>(stages) * m, 0);
  std::vector<char> waiting(static_cast<std::size_t>(stages) * m, 0);
  std::map<std::vector<int>, std::int64_t> seen;  // the largest constant of each state
  auto note = [&] {
    auto at = seen.find(now);
    if (at == seen.end()) {
      seen.emplace(now, constant);
    } else {
      at->second = std::max(at->second, constant);
    }
  };
  note();  // before the first action
  for (const Action& a : schedule.per_rank[r]) {
    const int j = local_[a.stage], slot = slot_of(a.micro_batch);
    const std::size_t cell = static_cast<std::size_t>(a.stage) * m + a.micro_batch;
    char& held = kept[cell];
    switch (a.kind) {
      case ActionKind::Forward:
        if (schedule.recomputes(a.micro_batch)) break;
        [[fallthrough]];
      case ActionKind::Recompute:
        if (!held) ++kept_count(slot, j);
        held = 1;
        break;
      case ActionKind::InputGrad:  // the graph stays until W, and the gradients W reads
        if (!waiting[cell]) ++waiting_count(slot, j);
        waiting[cell] = 1;
        break;
      case ActionKind::Backward:
      case ActionKind::WeightGrad:
        if (held) --kept_count(slot, j);
        held = 0;
        if (waiting[cell]) --waiting_count(slot, j);
        waiting[cell] = 0;
        now[4 * v + j] = 1;
        constant -= view_slack_;
        break;
    }
    note();
  }
  return seen;
}

// Walks each device's programme once and keeps the moments no other moment dominates (with
// equal counts, the one with the larger constant): the steady state of an M-micro-batch
// programme repeats a few states, so a handful remain.
void MultiStagePeakBound::collect_moments(const std::vector<std::int64_t>& sizes, ScheduleKind kind,
                                          CheckpointMode checkpoint) {
  const int devices = static_cast<int>(moments_.size());
  const int stages = static_cast<int>(rank_.size());
  const int m = static_cast<int>(sizes.size());
  const Schedule schedule = make_schedule(kind, stages, m, checkpoint, stages_per_device_);
  std::vector<int> count(devices, 0);
  for (int s = 0; s < stages; ++s) {
    rank_[s] = schedule.stage_rank[s];
    local_[s] = count[rank_[s]]++;
    stages_of_[rank_[s]].push_back(s);
  }
  for (int r = 0; r < devices; ++r) {
    const int v = count[r];
    std::vector<Moment>& kept_moments = moments_[r];
    for (auto& [key, largest] : device_states(schedule, r, v, sizes)) {
      Moment x;
      auto part = [&](int k) {
        return std::vector<int>(key.begin() + k * v, key.begin() + (k + 1) * v);
      };
      x.kept[0] = part(0);
      x.kept[1] = part(1);
      x.waiting[0] = part(2);
      x.waiting[1] = part(3);
      x.gradients.assign(key.begin() + 4 * v, key.end());
      x.constant = largest;
      if (std::any_of(kept_moments.begin(), kept_moments.end(),
                      [&](const Moment& y) { return dominated(x, y); }))
        continue;
      std::erase_if(kept_moments, [&](const Moment& y) { return dominated(y, x); });
      kept_moments.push_back(std::move(x));
    }
  }
}

std::int64_t MultiStagePeakBound::weight_kept_last(int slot, int k) const {
  return costs_.trained_bytes_of(k) > 0 ? size_[slot]->output_bytes[k] : 0;
}

std::int64_t MultiStagePeakBound::place(int t, int a, int b, bool with_input) {
  const bool input = with_input && count_inputs_ && own_input_[t] && a > 0 && b > a;
  for (int s : {0, 1}) {
    // A kept pair's input stays until its B or W ends, as its activations do.
    kept_[s][t] = size_[s]->kept_bytes_within(a, b) + (input ? size_[s]->output_bytes[a - 1] : 0);
    waiting_[s][t] =
        b > a ? weight_kept_[s][b] - weight_kept_[s][a] - weight_kept_last(s, b - 1) : 0;
  }
  // A tied tensor at its first holder only: torch's runtime holds it once on a rank that holds
  // several of its stages (a V's first and last), pipetune's executor once a stage.
  held_[t] = costs_.held_bytes_at_least(a, b);
  trained_[t] = costs_.trained_bytes_at_least(a, b);
  return device_bound(rank_[t]);
}

void MultiStagePeakBound::unplace(int t) {
  kept_[0][t] = kept_[1][t] = waiting_[0][t] = waiting_[1][t] = held_[t] = trained_[t] = 0;
}

std::int64_t MultiStagePeakBound::moment_level(const Moment& x, int r) const {
  std::int64_t level = x.constant;
  const std::vector<int>& stages = stages_of_[r];
  for (std::size_t j = 0; j < stages.size(); ++j) {
    const int s = stages[j];  // unplaced: every term 0
    level += x.kept[0][j] * kept_[0][s] + x.kept[1][j] * kept_[1][s] +
             x.waiting[0][j] * waiting_[0][s] + x.waiting[1][j] * waiting_[1][s] +
             (x.gradients[j] ? trained_[s] : 0);
  }
  return level;
}

std::int64_t MultiStagePeakBound::baseline(int r) const {
  const Profile& profile = costs_.profile();
  std::int64_t bytes = profile.device.library_bytes;
  if (r == rank_[0]) bytes += costs_.at(profile.batch_size).input_bytes;
  for (int s : stages_of_[r])  // as the simulator rounds it: per stage
    bytes += resident_bytes(held_[s], trained_[s], optimizer_state_factor_);
  return bytes;
}

std::int64_t MultiStagePeakBound::device_bound(int r) const {
  std::int64_t most = 0;  // the state before the first action
  level_cells_ += moments_[r].size() * stages_of_[r].size();
  for (const Moment& x : moments_[r]) most = std::max(most, moment_level(x, r));
  return baseline(r) + most;
}

void MultiStagePeakBound::place_all(const std::vector<int>& balance) {
  int a = 0;
  for (std::size_t t = 0; t < balance.size(); ++t) {
    place(static_cast<int>(t), a, a + balance[t]);
    a += balance[t];
  }
}

void MultiStagePeakBound::unplace_all() {
  for (std::size_t t = 0; t < rank_.size(); ++t) unplace(static_cast<int>(t));
}

std::vector<std::int64_t> MultiStagePeakBound::of(const std::vector<int>& balance) {
  place_all(balance);
  std::vector<std::int64_t> out;
  for (std::size_t r = 0; r < moments_.size(); ++r)
    out.push_back(device_bound(static_cast<int>(r)));
  unplace_all();
  return out;
}

std::vector<std::vector<std::int64_t>> MultiStagePeakBound::moment_levels(
    const std::vector<int>& balance) {
  place_all(balance);
  std::vector<std::vector<std::int64_t>> out(moments_.size());
  for (std::size_t r = 0; r < moments_.size(); ++r) {
    const int device = static_cast<int>(r);
    for (const Moment& x : moments_[r])
      out[r].push_back(baseline(device) + moment_level(x, device));
  }
  unplace_all();
  return out;
}

// The capped devices' moment levels under `balance` over their caps: the coordinates of
// may_fit()'s master programme.
std::vector<double> MultiStagePeakBound::relative_levels(const std::vector<Coordinate>& at,
                                                         const std::vector<std::int64_t>& caps,
                                                         const std::vector<int>& balance) {
  const std::vector<std::vector<std::int64_t>> levels = moment_levels(balance);
  std::vector<double> out;
  out.reserve(at.size());
  for (const Coordinate& c : at) {
    out.push_back(static_cast<double>(levels[c.device][c.moment]) /
                  static_cast<double>(caps[c.device]));
  }
  return out;
}

// Whether some balance may fit. A device's bound is at least its level at each of its moments,
// which is linear in each of its stages' layers; for weights y >= 0 summing to 1 over the
// (capped device, moment) pairs, sum y * level / cap is then linear in the layers, and its least
// over every balance is a min-sum partition (O(stages x layers)). A fitting balance has every
// level at most its cap, so that least is at most 1 for it: a least above 1 proves that no
// balance fits (a Lagrangian relaxation). The first weights are each device's fullest moment
// under equal layers per stage; then the best weights are found by cutting planes (Kelley's
// method): a master programme over the balances seen so far picks the weights whose least over
// them is largest, the partition prices them over every balance, and its balance joins the
// master. It stops when a least is above 1, when the master's value is at most 1 (the best
// weights over the balances seen, so over every balance too, cannot do better), when the least
// meets it (those weights are the best), when the master fails, or after kMasterRounds masters.
// What it cannot do: the relaxation is as strong as the balances' convex hull; a mix of balances
// can keep every level within its cap on average when no single one does.
bool MultiStagePeakBound::may_fit(const std::vector<std::int64_t>& caps) {
  return may_fit(caps, nullptr, 0.0);
}

bool MultiStagePeakBound::may_fit(const std::vector<std::int64_t>& caps, const StageWorkRows& rows,
                                  double limit) {
  return may_fit(caps, &rows, limit);
}

std::vector<double> StageWorkRows::values(const std::vector<int>& balance) const {
  const int stages = static_cast<int>(balance.size());
  std::vector<double> work(static_cast<std::size_t>(classes) * stages, 0.0);
  for (int s = 0, k = 0; s < stages; ++s)
    for (int end = k + balance[s]; k < end; ++k) work[layer_class[k] * stages + s] += layer_work[k];
  std::vector<double> out(constant);
  for (std::size_t i = 0; i < out.size(); ++i)
    for (std::size_t x = 0; x < work.size(); ++x) out[i] += slope[i][x] * work[x];
  return out;
}

std::vector<std::vector<double>> StageWorkRows::class_prefix() const {
  const std::size_t layers = layer_class.size();
  std::vector<std::vector<double>> prefix(classes, std::vector<double>(layers + 1, 0.0));
  for (std::size_t k = 0; k < layers; ++k) {
    for (auto& p : prefix) p[k + 1] = p[k];
    prefix[layer_class[k]][k + 1] += layer_work[k];
  }
  return prefix;
}

// One may_fit() question: its coordinates (the capped devices' moments, level / cap, then the
// rows, value / limit) and the pricing of weights on them over every balance.
struct MultiStagePeakBound::Relaxation {
  Relaxation(MultiStagePeakBound& bound, const std::vector<std::int64_t>& caps,
             const StageWorkRows* rows, double limit);
  // A balance's coordinates.
  std::vector<double> relative(const std::vector<int>& b);
  // The least over every balance of sum y * level / cap (+ y * row / limit; y summing to 1);
  // `balance` gets one that reaches it. Needs prepare_pricing() first.
  double price(const std::vector<double>& y);
  void prepare_pricing();
  // Each device's fullest moment under the `equal` balance, weighted by its cap (the bytes of
  // every device against the caps' sum); the largest row counts as one more device of the
  // average cap.
  std::vector<double> first_weights(const std::vector<double>& equal) const;

  MultiStagePeakBound& bound;
  const std::vector<std::int64_t>& caps;
  const StageWorkRows* rows;
  double limit;
  int layers, devices, stages;
  std::vector<Coordinate> at;
  std::size_t n_levels = 0;
  std::vector<int> balance;
  Prefixes prefixes;
  std::vector<Blend> blend;
  std::vector<double> weight, total;
  WorkTerms terms;
};

MultiStagePeakBound::Relaxation::Relaxation(MultiStagePeakBound& b,
                                            const std::vector<std::int64_t>& device_caps,
                                            const StageWorkRows* work_rows, double row_limit)
    : bound(b),
      caps(device_caps),
      rows(work_rows),
      limit(row_limit),
      layers(b.costs_.layer_count()),
      devices(static_cast<int>(b.moments_.size())),
      stages(static_cast<int>(b.rank_.size())) {
  for (int r = 0; r < devices; ++r) {
    if (caps[r] <= 0) continue;
    for (std::size_t k = 0; k < b.moments_[r].size(); ++k) at.push_back({r, static_cast<int>(k)});
  }
  if (rows != nullptr && (rows->constant.empty() || !(limit > 0.0))) rows = nullptr;
  if (rows != nullptr) {
    const std::size_t width = static_cast<std::size_t>(rows->classes) * stages;
    if (rows->slope.size() != rows->constant.size() ||
        std::any_of(rows->slope.begin(), rows->slope.end(),
                    [&](const std::vector<double>& x) { return x.size() != width; }) ||
        static_cast<int>(rows->layer_class.size()) != layers ||
        static_cast<int>(rows->layer_work.size()) != layers)
      throw std::invalid_argument("MultiStagePeakBound::may_fit: rows of another shape");
  }
  n_levels = at.size();
  balance.assign(stages, layers / stages);
  for (int t = 0; t < layers % stages; ++t) ++balance[t];
}

std::vector<double> MultiStagePeakBound::Relaxation::relative(const std::vector<int>& b) {
  std::vector<double> out = bound.relative_levels(at, caps, b);
  if (rows != nullptr) {
    bound.partition_cells_ += rows->constant.size() * (rows->slope.front().size() + 1) + layers;
    for (double value : rows->values(b)) out.push_back(value / limit);
  }
  return out;
}

void MultiStagePeakBound::Relaxation::prepare_pricing() {
  prefixes = bound.layer_prefixes();
  blend.resize(devices);
  weight.resize(devices);
  total.resize(devices);
  if (rows != nullptr) terms.prefix = rows->class_prefix();
}

double MultiStagePeakBound::Relaxation::price(const std::vector<double>& y) {
  std::fill(total.begin(), total.end(), 0.0);
  for (std::size_t i = 0; i < at.size(); ++i) total[at[i].device] += y[i];
  for (int r = 0; r < devices; ++r) {
    const int v = static_cast<int>(bound.stages_of_[r].size());
    Blend& b = blend[r];
    for (int slot : {0, 1}) b.kept[slot].assign(v, 0.0), b.waiting[slot].assign(v, 0.0);
    b.gradients.assign(v, 0.0);
    b.constant = 0.0;
    weight[r] = caps[r] > 0 ? total[r] / static_cast<double>(caps[r]) : 0.0;
  }
  for (std::size_t i = 0; i < at.size(); ++i) {
    const int r = at[i].device;
    if (total[r] <= 0.0) continue;
    const double share = y[i] / total[r];
    const Moment& x = bound.moments_[r][at[i].moment];
    Blend& b = blend[r];
    for (std::size_t j = 0; j < b.gradients.size(); ++j) {
      for (int slot : {0, 1}) {
        b.kept[slot][j] += share * x.kept[slot][j];
        b.waiting[slot][j] += share * x.waiting[slot][j];
      }
      b.gradients[j] += share * x.gradients[j];
    }
    b.constant += share * static_cast<double>(x.constant);
  }
  double sum = std::accumulate(total.begin(), total.end(), 0.0);
  if (rows != nullptr) {
    terms.slope.assign(rows->slope.front().size(), 0.0);
    terms.constant = 0.0;
    // The rows' weighted slopes, and in the partition a product per class and cell.
    bound.partition_cells_ += rows->constant.size() * terms.slope.size() +
                              static_cast<std::uint64_t>(stages) * layers * rows->classes / 2;
    for (std::size_t i = 0; i < rows->constant.size(); ++i) {
      const double w = y[n_levels + i];
      if (w <= 0.0) continue;
      sum += w;
      terms.constant += w * rows->constant[i] / limit;
      for (std::size_t x = 0; x < terms.slope.size(); ++x)
        terms.slope[x] += w * rows->slope[i][x] / limit;
    }
  }
  return bound.least_weighted(prefixes, weight, blend, rows != nullptr ? &terms : nullptr,
                              &balance) /
         sum;
}

std::vector<double> MultiStagePeakBound::Relaxation::first_weights(
    const std::vector<double>& equal) const {
  std::vector<double> y(equal.size(), 0.0);
  std::vector<int> fullest_at(devices, -1);
  double caps_sum = 0.0;
  int capped = 0;
  for (std::size_t i = 0; i < at.size(); ++i) {
    const int r = at[i].device;
    if (fullest_at[r] < 0 || equal[i] > equal[fullest_at[r]]) fullest_at[r] = static_cast<int>(i);
  }
  for (int r = 0; r < devices; ++r) {
    if (fullest_at[r] < 0) continue;
    y[fullest_at[r]] = static_cast<double>(caps[r]);
    caps_sum += static_cast<double>(caps[r]);
    ++capped;
  }
  if (rows != nullptr) {
    const auto top =
        std::max_element(equal.begin() + static_cast<std::ptrdiff_t>(n_levels), equal.end());
    const double share = capped > 0 ? caps_sum / capped : 1.0;
    *(y.begin() + (top - equal.begin())) = share;
    caps_sum += share;
  }
  for (double& x : y) x /= caps_sum;
  return y;
}

namespace {
constexpr double kMargin = 1e-9;  // above rounding in the sums
}  // namespace

bool MultiStagePeakBound::may_fit(const std::vector<std::int64_t>& caps, const StageWorkRows* rows,
                                  double limit) {
  // Its partitions price sums over a stage's layers, which a stage's input is not: its master's
  // coordinates leave the inputs out as well, so that both price the same levels.
  struct InputsOff {
    bool& flag;
    bool was;
    ~InputsOff() { flag = was; }
  } inputs_off{count_inputs_, count_inputs_};
  count_inputs_ = false;
  Relaxation relaxation(*this, caps, rows, limit);
  if (relaxation.at.empty() && relaxation.rows == nullptr) return true;
  const std::vector<double> equal = relaxation.relative(relaxation.balance);
  const double fullest = *std::max_element(equal.begin(), equal.end());
  if (fullest <= 1.0) return true;  // that balance's bound fits: nothing to prove
  relaxation.prepare_pricing();
  // First each device's fullest moment under the equal balance: on bench's capped 1,000-layer
  // profile it proves 71 of the 181 configurations that can be proven, without a master.
  std::vector<double> y = relaxation.first_weights(equal);
  if (relaxation.price(y) > 1.0 + kMargin) return false;
  return master_may_fit(relaxation, equal, y);
}

// The master of one round of may_fit() over the balances seen so far (`cuts`): the least over
// mixes of them of their largest mixed level, whose dual weights (one per coordinate) are the
// best y over those balances. Set up as MinMaxShareProgramme, a coordinate per balance and a
// function per (device, moment) and per row: its rows are the few balances, not the hundreds of
// moments (with those as rows and 32 devices the first solve had not ended after 1,272 pivots),
// and its least largest function is a level, positive. Its functions are the `active`
// coordinates and, while the mix found holds some other coordinate above the master's value,
// the fullest of those (row generation: with every (device, moment) pair from the start,
// hundreds of them, the masters were most of may_fit()'s work). Leaves the mix's coordinates in
// `mixed`, the weights of the master's functions in `weight_of` and their coordinates in
// `coordinate_of`; false where the master failed.
bool MultiStagePeakBound::solve_master(const std::vector<std::vector<double>>& cuts,
                                       std::vector<char>& active, std::vector<double>& mixed,
                                       std::vector<double>& weight_of,
                                       std::vector<std::size_t>& coordinate_of) {
  const std::size_t n = active.size();
  std::vector<double> mix, slope;
  MinMaxShareProgramme master(cuts.size(), 1.0);
  // A few pivots per row and column; past that it has lost its way, and answers nothing.
  master.limit_pivots(4 * (cuts.size() + n + 2));
  coordinate_of.clear();
  auto add = [&](std::size_t k) {
    slope.resize(cuts.size());
    for (std::size_t j = 0; j < cuts.size(); ++j) slope[j] = cuts[j][k];
    master.add(0.0, slope);
    coordinate_of.push_back(k);
  };
  for (std::size_t k = 0; k < n; ++k)
    if (active[k]) add(k);
  double value = 0.0;
  while (true) {
    master.solve(&mix, &weight_of);
    if (!master.optimal()) break;
    value = 0.0;
    for (std::size_t k = 0; k < n; ++k) {
      mixed[k] = 0.0;
      for (std::size_t j = 0; j < cuts.size(); ++j) mixed[k] += mix[j] * cuts[j][k];
      if (active[k]) value = std::max(value, mixed[k]);
    }
    std::vector<std::size_t> above;
    for (std::size_t k = 0; k < n; ++k)
      if (!active[k] && mixed[k] > value + kMargin) above.push_back(k);
    if (above.empty()) break;
    const std::size_t count = std::min(above.size(), planning::kMasterRowsAtOnce);
    std::partial_sort(above.begin(), above.begin() + static_cast<std::ptrdiff_t>(count),
                      above.end(),
                      [&](std::size_t a, std::size_t b) { return mixed[a] > mixed[b]; });
    for (std::size_t i = 0; i < count; ++i) {
      active[above[i]] = 1;
      add(above[i]);
    }
  }
  pivot_cells_ += master.pivot_cells() + coordinate_of.size() * cuts.size() * cuts.size() +
                  n * cuts.size();  // the mixed levels
  return master.optimal();
}

// may_fit()'s cutting planes once its first weights proved nothing: the master's weights priced
// over every balance, each priced balance a cut of the next master's.
bool MultiStagePeakBound::master_may_fit(Relaxation& relaxation, const std::vector<double>& equal,
                                         std::vector<double>& y) {
  // The piles show the master what concentrating layers on one stage does: without them the
  // first weights are extreme and the least balance dodges them (proofs took 23 prices on
  // bench's capped 1,000-layer profile; with them, one).
  const int stages = relaxation.stages, layers = relaxation.layers;
  std::vector<std::vector<double>> cuts{equal, relaxation.relative(relaxation.balance)};
  for (int t = 0; t < stages; ++t) {
    std::vector<int> pile(stages, 1);
    pile[t] = layers - (stages - 1);
    cuts.push_back(relaxation.relative(pile));
  }
  // The master's functions: at first each cut's fullest coordinate and each device's fullest
  // moment under the equal balance; then those solve_master() generates.
  const std::size_t n = equal.size();
  std::vector<char> active(n, 0);
  for (std::size_t k = 0; k < n; ++k) active[k] = y[k] > 0.0;
  for (const std::vector<double>& cut : cuts)
    active[std::max_element(cut.begin(), cut.end()) - cut.begin()] = 1;
  std::vector<double> weight_of, mixed(n);
  std::vector<std::size_t> coordinate_of;  // the master's functions, in the order added
  for (int round = 0; round < planning::kMasterRounds; ++round) {
    if (!solve_master(cuts, active, mixed, weight_of, coordinate_of)) return true;
    // The mix's largest level is at least the master's value, which is at least the
    // relaxation's: at most 1, nothing can be proven.
    const double mixed_top = *std::max_element(mixed.begin(), mixed.end());
    if (mixed_top <= 1.0 + kMargin) return true;
    std::fill(y.begin(), y.end(), 0.0);
    for (std::size_t i = 0; i < coordinate_of.size(); ++i) y[coordinate_of[i]] = weight_of[i];
    const double least = relaxation.price(y);
    if (least > 1.0 + kMargin) return false;
    if (least >= mixed_top - kMargin) return true;  // y is the best weights
    cuts.push_back(relaxation.relative(relaxation.balance));
    const std::vector<double>& cut = cuts.back();
    active[std::max_element(cut.begin(), cut.end()) - cut.begin()] = 1;
  }
  return true;
}

MultiStagePeakBound::Prefixes MultiStagePeakBound::layer_prefixes() const {
  const int layers = costs_.layer_count();
  Prefixes out;
  for (int slot : {0, 1}) {
    const SizeCosts& c = *size_[slot];
    out.kept[slot].assign(layers + 1, 0.0);
    out.waiting[slot].assign(layers + 1, 0.0);
    out.waiting_before[slot].assign(layers + 1, 0.0);
    for (int b = 0; b <= layers; ++b) {
      out.waiting[slot][b] = static_cast<double>(weight_kept_[slot][b]);
      out.waiting_before[slot][b] =
          out.waiting[slot][b] - (b > 0 ? static_cast<double>(weight_kept_last(slot, b - 1)) : 0.0);
    }
    out.kept_before[slot].assign(layers + 1, 0.0);
    out.stored[slot].assign(layers + 1, 0.0);
    out.maker.assign(layers + 1, -1);
    int maker = -1;
    for (int b = 0; b <= layers; ++b) {
      out.kept[slot][b] = static_cast<double>(c.kept_prefix[b]);
      if (b > 0 && !c.aliases[b - 1]) maker = b - 1;
      out.maker[b] = maker;  // views are a layer's, the same in both slots
      out.stored[slot][b] = maker >= 0 ? static_cast<double>(c.stored_bytes[maker]) : 0.0;
      out.kept_before[slot][b] = out.kept[slot][b] - out.stored[slot][b];
    }
  }
  out.held.assign(layers + 1, 0.0);
  out.trained.assign(layers + 1, 0.0);
  for (int b = 0; b < layers; ++b) {
    out.held[b + 1] = out.held[b] + static_cast<double>(costs_.held_bytes_at_least(b, b + 1));
    out.trained[b + 1] =
        out.trained[b] + static_cast<double>(costs_.trained_bytes_at_least(b, b + 1));
  }
  return out;
}

// The weighted terms no balance moves: each device's library bytes and its moment's constant,
// and the batch's input on stage 0's device.
double MultiStagePeakBound::weighted_fixed(const std::vector<double>& weight,
                                           const std::vector<Blend>& at) const {
  const Profile& profile = costs_.profile();
  double fixed = 0.0;
  for (std::size_t r = 0; r < at.size(); ++r) {
    double own = static_cast<double>(profile.device.library_bytes) + at[r].constant;
    if (static_cast<int>(r) == rank_[0])
      own += static_cast<double>(costs_.at(profile.batch_size).input_bytes);
    fixed += weight[r] * own;
  }
  return fixed;
}

// The min-sum partition: stage s = [a, b) adds w0 (K0[b] - K0[a]) + w1 (K1[b] - K1[a]) +
// g0 (V0[b] - G0[a]) + g1 (V1[b] - G1[a]) + p (P[b] - P[a]) + u (T[b] - T[a]), K being the
// prefix of the kept bytes, less the storage of the stage's last layer that makes some (when it
// has one), G the prefix of the gradients I keeps for W and V the same less the last layer's, P
// that of the parameters (their weights) and T that of those that train (their gradients and
// optimizer state) (layer_prefixes()): each device's weighted level, exactly, but for half a
// byte of rounding.
double MultiStagePeakBound::least_weighted(const Prefixes& prefixes,
                                           const std::vector<double>& weight,
                                           const std::vector<Blend>& at, const WorkTerms* work,
                                           std::vector<int>* balance) const {
  const int layers = costs_.layer_count();
  const int stages = static_cast<int>(rank_.size());
  const auto& kept_prefix = prefixes.kept;
  const auto& kept_before = prefixes.kept_before;
  const std::vector<double>& held = prefixes.held;
  const std::vector<double>& trained = prefixes.trained;
  double fixed = weighted_fixed(weight, at);
  // The stages' parameters, buffers and optimizer state, rounded per stage by the simulator (at
  // most half a byte each below the exact product).
  const double state = optimizer_state_factor_;
  std::vector<double> least(layers + 1, kInfBytes), next(layers + 1);
  std::vector<std::vector<int>> from(stages, std::vector<int>(layers + 1, -1));
  partition_cells_ += static_cast<std::uint64_t>(stages) * static_cast<std::uint64_t>(layers);
  least[0] = 0.0;
  if (work != nullptr) fixed += work->constant;
  const int classes = work != nullptr ? static_cast<int>(work->prefix.size()) : 0;
  for (int s = 0; s < stages; ++s) {
    const int r = rank_[s];
    const int j = local_[s];
    const double w[2] = {weight[r] * at[r].kept[0][j], weight[r] * at[r].kept[1][j]};
    const double g[2] = {weight[r] * at[r].waiting[0][j], weight[r] * at[r].waiting[1][j]};
    const double p = weight[r];
    const double u = weight[r] * (at[r].gradients[j] + state);
    fixed -= 0.5 * weight[r];
    auto work_part = [&](int b) {
      double sum = 0.0;
      for (int k = 0; k < classes; ++k) sum += work->slope[k * stages + s] * work->prefix[k][b];
      return sum;
    };
    auto end_part = [&](int b) {
      return w[0] * kept_before[0][b] + w[1] * kept_before[1][b] + p * held[b] + u * trained[b] +
             g[0] * prefixes.waiting_before[0][b] + g[1] * prefixes.waiting_before[1][b] +
             work_part(b);
    };
    auto start_part = [&](int a) {
      return w[0] * kept_prefix[0][a] + w[1] * kept_prefix[1][a] + p * held[a] + u * trained[a] +
             g[0] * prefixes.waiting[0][a] + g[1] * prefixes.waiting[1][a] + work_part(a);
    };
    // The least over a < b of least[a] - start_part(a), apart for the starts after the last
    // layer before b that makes storage (a stage of views only keeps that layer's storage, which
    // kept_before takes off): exact, so that may_fit() decides its relaxation.
    double made = kInfBytes, views = kInfBytes;
    int made_at = -1, views_at = -1;
    std::fill(next.begin(), next.end(), kInfBytes);
    for (int b = 1; b <= layers; ++b) {
      const double start = least[b - 1] < kInfBytes ? least[b - 1] - start_part(b - 1) : kInfBytes;
      if (prefixes.maker[b] ==
          b - 1) {  // layer b - 1 makes storage: every start so far is before it
        if (views < made) made = views, made_at = views_at;
        if (start < made) made = start, made_at = b - 1;
        views = kInfBytes;
        views_at = -1;
      } else if (start < views) {
        views = start;
        views_at = b - 1;
      }
      const double end = end_part(b);
      const double end_of_views = end + w[0] * prefixes.stored[0][b] + w[1] * prefixes.stored[1][b];
      if (made_at >= 0 && made + end <= views + end_of_views) {
        next[b] = made + end;
        from[s][b] = made_at;
      } else if (views_at >= 0) {
        next[b] = views + end_of_views;
        from[s][b] = views_at;
      }
    }
    least.swap(next);
  }
  if (balance != nullptr && least[layers] < kInfBytes) *balance = traced_balance(from, layers);
  return fixed + least[layers];
}

std::vector<std::int64_t> multi_stage_peak_bounds(const Profile& profile, const Plan& plan,
                                                  const Hardware* hardware) {
  const CostModel costs(profile);
  const int v = std::max(1, plan.stages_per_device);
  MultiStagePeakBound bound(
      costs, split_batch(profile.batch_size, plan.chunks), plan.schedule, plan.checkpoint,
      plan.stages() / v, v, plan.optimizer_state_factor,
      hardware ? stage_inputs_own(stage_devices(plan, *hardware), *hardware) : std::vector<char>{});
  return bound.of(plan.balance);
}

}  // namespace pipetune
