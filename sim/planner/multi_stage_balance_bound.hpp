#pragma once
// A sound bound on multi-stage balances and their prefixes, for the planner's enumeration and
// `multi_stage_balance_bound()`; internal to sim/.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "sim/cost_model.hpp"
#include "sim/hardware.hpp"
#include "sim/schedule.hpp"

namespace pipetune::planning {

// A lower bound on the simulated time of a multi-stage plan, and of every plan whose first stages
// are given. Device r works at least its stages' least work (forward with or without autograd,
// whole or split backward, over every micro-batch; recomputes and copies left out) plus a
// forward and a backward task's overhead per stage and micro-batch (busy). Its programme's first
// action, a forward of stage s, waits for some micro-batch's forward through the stages below s,
// none of them on r, and its copies across their boundaries (head); when its programme ends with
// a B or I of stage s, that micro-batch's gradient still has the stages below s and their
// boundaries to pass, none of them on r either (tail); a copy at the least bytes the boundary's
// layer outputs at any micro-batch size. The time is
// at least max over r of head + busy + tail. Stages are placed in order; each term only grows as
// more are placed, and a term that needs stages not yet placed counts 0, so the bound of a prefix
// holds for every completion.
class MultiStageBalanceBound {
 public:
  MultiStageBalanceBound(const CostModel& costs, const std::vector<std::int64_t>& sizes,
                         ScheduleKind kind, CheckpointMode checkpoint, int devices, int v,
                         std::vector<double> speed, double overhead, const Hardware& hardware)
      : stages_(devices * v), speed_(std::move(speed)), overhead_(overhead) {
    const int layers = costs.layer_count();
    work_.assign(layers + 1, 0.0);
    head_.assign(layers + 1, 0.0);
    tail_.assign(layers + 1, 0.0);
    least_output_.assign(layers, std::numeric_limits<double>::infinity());
    // Each micro-batch's costs looked up once, not once per layer: with a batch of 1,024 and
    // 3,000 layers the lookups made this about a millisecond a slice.
    std::vector<const SizeCosts*> of_size;
    of_size.reserve(sizes.size());
    for (std::int64_t size : sizes) of_size.push_back(&costs.at(size));
    for (int k = 0; k < layers; ++k) {
      double work = 0.0, head = std::numeric_limits<double>::infinity(),
             tail = std::numeric_limits<double>::infinity();
      for (const SizeCosts* size_costs : of_size) {
        const SizeCosts& c = *size_costs;
        work += c.least_forward_ms(k) + c.least_backward_ms(k);
        head = std::min(head, c.least_forward_ms(k));
        tail = std::min(tail, c.least_input_backward_ms(k));
        least_output_[k] = std::min(least_output_[k], static_cast<double>(c.output_bytes[k]));
      }
      work_[k + 1] = work_[k] + work;
      head_[k + 1] = head_[k] + head;
      tail_[k + 1] = tail_[k] + tail;
    }
    const int m = static_cast<int>(sizes.size());
    const Schedule schedule = make_schedule(kind, stages_, m, checkpoint, v);
    rank_ = schedule.stage_rank;
    // The link each boundary's copies take, as the simulator's: none where both stages are on
    // one device.
    link_.assign(stages_, nullptr);
    for (int t = 0; t + 1 < stages_; ++t) {
      if (rank_[t] == rank_[t + 1]) continue;
      link_[t] = &hardware.copy_link(rank_[t], rank_[t + 1]);
    }
    first_.assign(devices, 0);
    last_.assign(devices, -1);
    for (int r = 0; r < devices; ++r) {
      const auto& programme = schedule.per_rank[r];
      first_[r] = programme.front().stage;
      if (sends_gradient(programme.back().kind)) last_[r] = programme.back().stage;
    }
    fixed_ = overhead_ * 2.0 * v * m;
    busy_.assign(devices, 0.0);
    stage_work_.assign(stages_, 0.0);
    head_chain_.assign(stages_ + 1, 0.0);
    tail_chain_.assign(stages_ + 1, 0.0);
  }

  /// Stage t (placed after stages 0 … t − 1) holds layers [a, b).
  void place(int t, int a, int b) {
    const double speed = speed_[rank_[t]];
    stage_work_[t] = (work_[b] - work_[a]) / speed;
    busy_[rank_[t]] += stage_work_[t];
    // The chains cross the boundary after t too: an activation on the way in, a gradient (of
    // as many bytes) on the way back.
    const double copy = link_[t] ? link_[t]->transfer_ms(least_output_[b - 1]) : 0.0;
    head_chain_[t + 1] = head_chain_[t] + (head_[b] - head_[a]) / speed + overhead_ + copy;
    tail_chain_[t + 1] = tail_chain_[t] + (tail_[b] - tail_[a]) / speed + overhead_ + copy;
  }
  void unplace(int t) { busy_[rank_[t]] -= stage_work_[t]; }

  /// The bound with stages 0 … placed − 1 placed.
  double bound(int placed) const {
    double out = 0.0;
    for (std::size_t r = 0; r < busy_.size(); ++r) {
      double time = busy_[r] + fixed_;
      if (first_[r] <= placed) time += head_chain_[first_[r]];
      if (last_[r] >= 0 && last_[r] <= placed) time += tail_chain_[last_[r]];
      out = std::max(out, time);
    }
    return out;
  }

  /// The bound of one whole balance.
  double of(const std::vector<int>& balance) {
    int a = 0;
    for (int t = 0; t < stages_; ++t) {
      place(t, a, a + balance[t]);
      a += balance[t];
    }
    const double out = bound(stages_);
    for (int t = 0; t < stages_; ++t) unplace(t);
    return out;
  }

 private:
  int stages_;
  std::vector<double> speed_;  // per device (programme)
  double overhead_;
  std::vector<double> work_, head_, tail_;  // prefix sums over layers
  std::vector<double> least_output_;        // per layer, over the micro-batch sizes
  std::vector<int> rank_;                   // programme of each stage
  std::vector<const Link*> link_;           // per stage: its copies' to the next, or null
  std::vector<int> first_, last_;           // per programme: its first action's stage, and its
                                            // last's when a B or I (else -1)
  double fixed_ = 0.0;
  std::vector<double> busy_, stage_work_, head_chain_, tail_chain_;
};

}  // namespace pipetune::planning
