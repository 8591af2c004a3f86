#include "sim/multi_stage_peak_bound.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>

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

}  // namespace

MultiStagePeakBound::MultiStagePeakBound(const CostModel& costs,
                                         const std::vector<std::int64_t>& sizes, ScheduleKind kind,
                                         CheckpointMode checkpoint, int devices,
                                         int stages_per_device, double optimizer_state_factor)
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
  params_.assign(stages, 0);
  collect_moments(sizes, kind, checkpoint);
}

// Walks each device's programme once, noting the state after every action, and keeps the
// moments no other moment dominates (with equal counts, the one with the larger constant):
// the steady state of an M-micro-batch programme repeats a few states, so a handful remain.
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
  auto slot_of = [&](int i) { return sizes[i] == sizes.front() ? 0 : 1; };
  for (int r = 0; r < devices; ++r) {
    const int v = count[r];
    Moment now;
    for (int s : {0, 1}) now.kept[s].assign(v, 0), now.waiting[s].assign(v, 0);
    now.gradients.assign(v, 0);
    std::vector<std::vector<char>> kept(stages, std::vector<char>(m, 0));
    std::vector<std::vector<char>> waiting(stages, std::vector<char>(m, 0));
    using Key = std::tuple<std::vector<int>, std::vector<int>, std::vector<int>, std::vector<int>,
                           std::vector<char>>;
    std::map<Key, std::int64_t> seen;  // the largest constant of each state
    auto note = [&] {
      Key key{now.kept[0], now.kept[1], now.waiting[0], now.waiting[1], now.gradients};
      auto [at, fresh] = seen.emplace(std::move(key), now.constant);
      if (!fresh) at->second = std::max(at->second, now.constant);
    };
    note();  // before the first action
    for (const Action& a : schedule.per_rank[r]) {
      const int j = local_[a.stage], slot = slot_of(a.micro_batch);
      char& held = kept[a.stage][a.micro_batch];
      switch (a.kind) {
        case ActionKind::Forward:
          if (schedule.recomputes(a.micro_batch)) break;
          [[fallthrough]];
        case ActionKind::Recompute:
          if (!held) ++now.kept[slot][j];
          held = 1;
          break;
        case ActionKind::InputGrad:  // the graph stays until W, and the gradients W reads
          if (!waiting[a.stage][a.micro_batch]) ++now.waiting[slot][j];
          waiting[a.stage][a.micro_batch] = 1;
          break;
        case ActionKind::Backward:
        case ActionKind::WeightGrad:
          if (held) --now.kept[slot][j];
          held = 0;
          if (waiting[a.stage][a.micro_batch]) --now.waiting[slot][j];
          waiting[a.stage][a.micro_batch] = 0;
          now.gradients[j] = 1;
          now.constant -= view_slack_;
          break;
      }
      note();
    }
    std::vector<Moment>& kept_moments = moments_[r];
    for (auto& [key, constant] : seen) {
      Moment x;
      x.kept[0] = std::get<0>(key);
      x.kept[1] = std::get<1>(key);
      x.waiting[0] = std::get<2>(key);
      x.waiting[1] = std::get<3>(key);
      x.gradients = std::get<4>(key);
      x.constant = constant;
      if (std::any_of(kept_moments.begin(), kept_moments.end(),
                      [&](const Moment& y) { return dominated(x, y); }))
        continue;
      std::erase_if(kept_moments, [&](const Moment& y) { return dominated(y, x); });
      kept_moments.push_back(std::move(x));
    }
  }
}

std::int64_t MultiStagePeakBound::weight_kept_last(int slot, int k) const {
  return costs_.param_bytes_of(k) > 0 ? size_[slot]->output_bytes[k] : 0;
}

std::int64_t MultiStagePeakBound::place(int t, int a, int b) {
  for (int s : {0, 1}) {
    kept_[s][t] = size_[s]->kept_bytes_within(a, b);
    waiting_[s][t] =
        b > a ? weight_kept_[s][b] - weight_kept_[s][a] - weight_kept_last(s, b - 1) : 0;
  }
  params_[t] = costs_.param_bytes(a, b);
  return device_bound(rank_[t]);
}

void MultiStagePeakBound::unplace(int t) {
  kept_[0][t] = kept_[1][t] = waiting_[0][t] = waiting_[1][t] = params_[t] = 0;
}

std::int64_t MultiStagePeakBound::moment_level(const Moment& x, int r) const {
  std::int64_t level = x.constant;
  const std::vector<int>& stages = stages_of_[r];
  for (std::size_t j = 0; j < stages.size(); ++j) {
    const int s = stages[j];  // unplaced: every term 0
    level += x.kept[0][j] * kept_[0][s] + x.kept[1][j] * kept_[1][s] +
             x.waiting[0][j] * waiting_[0][s] + x.waiting[1][j] * waiting_[1][s] +
             (x.gradients[j] ? params_[s] : 0);
  }
  return level;
}

std::int64_t MultiStagePeakBound::device_bound(int r) const {
  const Profile& profile = costs_.profile();
  std::int64_t baseline = profile.device.library_bytes;
  if (r == rank_[0]) baseline += costs_.at(profile.batch_size).input_bytes;
  for (int s : stages_of_[r])  // as the simulator rounds it: per stage
    baseline += std::llround(static_cast<double>(params_[s]) * (1.0 + optimizer_state_factor_));
  std::int64_t most = 0;  // the state before the first action
  for (const Moment& x : moments_[r]) most = std::max(most, moment_level(x, r));
  return baseline + most;
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

// Walks the balance's stages in and out to pick, per device, its moment of most bytes.
std::vector<int> MultiStagePeakBound::fullest_moments(const std::vector<int>& balance) {
  place_all(balance);
  std::vector<int> at;
  for (std::size_t r = 0; r < moments_.size(); ++r) {
    int fullest = 0;
    std::int64_t most = std::numeric_limits<std::int64_t>::min();
    for (std::size_t k = 0; k < moments_[r].size(); ++k) {
      const std::int64_t level = moment_level(moments_[r][k], static_cast<int>(r));
      if (level > most) most = level, fullest = static_cast<int>(k);
    }
    at.push_back(fullest);
  }
  unplace_all();
  return at;
}

// Whether some balance may fit. A device's bound is at least any average of its levels at its
// moments, which is linear in each of its stages' layers; weighted by a multiplier per capped
// device and summed, its least over every balance is a min-sum partition (O(stages x layers)).
// A fitting balance has every device's bound at most its cap, so for any multipliers its
// weighted sum is at most the caps' weighted sum: a least above that proves that no balance
// fits. The multipliers start equal and grow gently on the devices that the least balance
// overfills (a Lagrangian relaxation; a steep step piles the weight on one device and lets the
// partition load the others without bound), for at most 16 rounds and until four rounds no
// longer raise the best ratio of the least to the caps; each device's average is over the
// moments of most bytes under the least balances so far (fictitious play: a device with a
// recompute of each of two stages holds one at a time, and one moment alone would let the
// partition put every layer in the other).
bool MultiStagePeakBound::may_fit(const std::vector<std::int64_t>& caps) {
  const int layers = costs_.layer_count();
  const int devices = static_cast<int>(moments_.size());
  const int stages = static_cast<int>(rank_.size());
  std::vector<double> weight(devices, 0.0);
  int capped = 0;
  for (int r = 0; r < devices; ++r) {
    weight[r] = caps[r] > 0 ? 1.0 : 0.0;
    capped += caps[r] > 0 ? 1 : 0;
  }
  if (capped == 0) return true;
  std::vector<int> balance(stages, layers / stages);
  for (int t = 0; t < layers % stages; ++t) ++balance[t];
  std::vector<Blend> blend(devices);
  std::vector<std::vector<int>> picked(devices);
  for (int r = 0; r < devices; ++r) picked[r].assign(moments_[r].size(), 0);
  const Prefixes prefixes = layer_prefixes();
  constexpr int kRounds = 16;
  double best_ratio = 0.0;
  int stalled = 0;
  for (int round = 0; round < kRounds; ++round) {
    const std::vector<int> at = fullest_moments(balance);
    for (int r = 0; r < devices; ++r) {
      ++picked[r][at[r]];
      const int v = static_cast<int>(stages_of_[r].size());
      Blend& b = blend[r];
      for (int slot : {0, 1}) b.kept[slot].assign(v, 0.0), b.waiting[slot].assign(v, 0.0);
      b.gradients.assign(v, 0.0);
      b.constant = 0.0;
      for (std::size_t k = 0; k < moments_[r].size(); ++k) {
        if (picked[r][k] == 0) continue;
        const double share = static_cast<double>(picked[r][k]) / (round + 1);
        const Moment& x = moments_[r][k];
        for (int j = 0; j < v; ++j) {
          for (int slot : {0, 1}) {
            b.kept[slot][j] += share * x.kept[slot][j];
            b.waiting[slot][j] += share * x.waiting[slot][j];
          }
          b.gradients[j] += share * x.gradients[j];
        }
        b.constant += share * static_cast<double>(x.constant);
      }
    }
    double cap_sum = 0.0;
    for (int r = 0; r < devices; ++r) cap_sum += weight[r] * static_cast<double>(caps[r]);
    const double least = least_weighted(prefixes, weight, blend, &balance);
    if (least > cap_sum * (1.0 + 1e-9) + 1.0) return false;
    // Four rounds that do not raise the best ratio of least to caps: it has settled.
    if (least / cap_sum > best_ratio * 1.001) {
      best_ratio = least / cap_sum;
      stalled = 0;
    } else if (++stalled == 4) {
      return true;
    }
    // The least balance's own bounds: where every device is within its cap, nothing is proven.
    const std::vector<std::int64_t> bound = of(balance);
    double total = 0.0;
    bool over = false;
    for (int r = 0; r < devices; ++r) {
      if (caps[r] <= 0) continue;
      const double excess = static_cast<double>(bound[r] - caps[r]) / static_cast<double>(caps[r]);
      over = over || excess > 0.0;
      weight[r] *= std::exp(0.5 * std::clamp(excess, -0.5, 0.5));
      total += weight[r];
    }
    if (!over) return true;
    for (double& w : weight) w *= capped / total;
  }
  return true;
}

// P, the prefix of kept bytes per size slot; K, the same less the storage of the last layer
// before b that makes one (kept_bytes_within(a, b) is at least K[b] - P[a]); G and V, the same
// pair for the gradients I keeps for W (exactly V[b] - G[a]); and the prefix of parameter bytes.
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
    int maker = -1;
    for (int b = 0; b <= layers; ++b) {
      out.kept[slot][b] = static_cast<double>(c.kept_prefix[b]);
      if (b > 0 && !c.aliases[b - 1]) maker = b - 1;
      out.kept_before[slot][b] =
          out.kept[slot][b] - (maker >= 0 ? static_cast<double>(c.stored_bytes[maker]) : 0.0);
    }
  }
  out.params.assign(layers + 1, 0.0);
  for (int b = 0; b < layers; ++b)
    out.params[b + 1] = out.params[b] + static_cast<double>(costs_.param_bytes(b, b + 1));
  return out;
}

// The min-sum partition: stage s = [a, b) adds at least w0 (K0[b] - P0[a]) + w1 (K1[b] - P1[a]) +
// g0 (V0[b] - G0[a]) + g1 (V1[b] - G1[a]) + u (params[b] - params[a]), G being the prefix of the
// gradients I keeps for W and V the same less the last layer's (layer_prefixes()).
double MultiStagePeakBound::least_weighted(const Prefixes& prefixes,
                                           const std::vector<double>& weight,
                                           const std::vector<Blend>& at,
                                           std::vector<int>* balance) const {
  const Profile& profile = costs_.profile();
  const int layers = costs_.layer_count();
  const int stages = static_cast<int>(rank_.size());
  const auto& kept_prefix = prefixes.kept;
  const auto& kept_before = prefixes.kept_before;
  const std::vector<double>& params = prefixes.params;
  double fixed = 0.0;
  for (std::size_t r = 0; r < at.size(); ++r) {
    double own = static_cast<double>(profile.device.library_bytes) + at[r].constant;
    if (static_cast<int>(r) == rank_[0])
      own += static_cast<double>(costs_.at(profile.batch_size).input_bytes);
    fixed += weight[r] * own;
  }
  // The stages' parameters and optimizer state, rounded per stage by the simulator (at most
  // half a byte each below the exact product).
  const double state = 1.0 + optimizer_state_factor_;
  std::vector<double> least(layers + 1, kInfBytes), next(layers + 1);
  std::vector<std::vector<int>> from(stages, std::vector<int>(layers + 1, -1));
  partition_cells_ += static_cast<std::uint64_t>(stages) * static_cast<std::uint64_t>(layers);
  least[0] = 0.0;
  for (int s = 0; s < stages; ++s) {
    const int r = rank_[s];
    const int j = local_[s];
    const double w[2] = {weight[r] * at[r].kept[0][j], weight[r] * at[r].kept[1][j]};
    const double g[2] = {weight[r] * at[r].waiting[0][j], weight[r] * at[r].waiting[1][j]};
    const double u = weight[r] * (at[r].gradients[j] + state);
    fixed -= 0.5 * weight[r];
    auto end_part = [&](int b) {
      return w[0] * kept_before[0][b] + w[1] * kept_before[1][b] + u * params[b] +
             g[0] * prefixes.waiting_before[0][b] + g[1] * prefixes.waiting_before[1][b];
    };
    auto start_part = [&](int a) {
      return w[0] * kept_prefix[0][a] + w[1] * kept_prefix[1][a] + u * params[a] +
             g[0] * prefixes.waiting[0][a] + g[1] * prefixes.waiting[1][a];
    };
    double running = kInfBytes;  // least over a < b of least[a] - start_part(a)
    int arg = -1;
    std::fill(next.begin(), next.end(), kInfBytes);
    for (int b = 1; b <= layers; ++b) {
      if (least[b - 1] < kInfBytes && least[b - 1] - start_part(b - 1) < running) {
        running = least[b - 1] - start_part(b - 1);
        arg = b - 1;
      }
      if (arg >= 0) {
        next[b] = running + end_part(b);
        from[s][b] = arg;
      }
    }
    least.swap(next);
  }
  if (balance != nullptr && least[layers] < kInfBytes) {
    for (int s = stages - 1, b = layers; s >= 0; --s) {
      const int a = from[s][b];
      (*balance)[s] = b - a;
      b = a;
    }
  }
  return fixed + least[layers];
}

std::vector<std::int64_t> multi_stage_peak_bounds(const Profile& profile, const Plan& plan) {
  const CostModel costs(profile);
  const int v = std::max(1, plan.stages_per_device);
  MultiStagePeakBound bound(costs, split_batch(profile.batch_size, plan.chunks), plan.schedule,
                            plan.checkpoint, plan.stages() / v, v, plan.optimizer_state_factor);
  return bound.of(plan.balance);
}

}  // namespace pipetune
