#include "sim/order_peak.hpp"

#include <algorithm>
#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/boykov_kolmogorov_max_flow.hpp>
#include <utility>

namespace pipetune {
namespace {

using Traits = boost::adjacency_list_traits<boost::vecS, boost::vecS, boost::directedS>;
using FlowGraph = boost::adjacency_list<
    boost::vecS, boost::vecS, boost::directedS,
    boost::property<
        boost::vertex_color_t, boost::default_color_type,
        boost::property<boost::vertex_distance_t, long,
                        boost::property<boost::vertex_predecessor_t, Traits::edge_descriptor>>>,
    boost::property<
        boost::edge_capacity_t, std::int64_t,
        boost::property<boost::edge_residual_capacity_t, std::int64_t,
                        boost::property<boost::edge_reverse_t, Traits::edge_descriptor>>>>;

struct Precedence {
  int before = 0, after = 0;  // events
};

// One counter's events and their order: each task's start, then up to two steps down from its
// transient peak, then its end; across a graph edge, the earlier task's end before the later
// one's start. An event that does not change the counter is merged into the one before it in its
// task: that changes no set's sum and forces nothing more (only the task's own earlier events
// come before it), so the largest sum is the same on a graph a quarter the size.
struct CounterEvents {
  std::vector<std::int64_t> weight;  // what each event adds to the counter
  std::vector<Precedence> order;
};

CounterEvents counter_events(const EventEngine& engine,
                             const std::vector<std::pair<int, int>>& edges, int counter) {
  CounterEvents out;
  const int n = static_cast<int>(engine.task_count());
  std::vector<int> start(n), end(n);
  auto add_event = [&](std::int64_t weight) {
    out.weight.push_back(weight);
    return static_cast<int>(out.weight.size()) - 1;
  };
  for (int k = 0; k < n; ++k) {
    const EventEngine::Effects e = engine.effects(k);
    const bool here = e.start_counter == counter;
    start[k] = add_event(here ? e.start_bytes : 0);
    int last = start[k];
    for (const std::int64_t freed : {e.mid_bytes, e.late_bytes}) {
      if (!here || freed == 0) continue;
      const int mid = add_event(-freed);
      out.order.push_back({last, mid});
      last = mid;
    }
    if (e.end_counter == counter && e.end_bytes != 0) {
      const int finish = add_event(-e.end_bytes);
      out.order.push_back({last, finish});
      last = finish;
    }
    end[k] = last;
  }
  for (const auto& [a, b] : edges) out.order.push_back({end[a], start[b]});
  return out;
}

void add_arc(FlowGraph& g, int from, int to, std::int64_t capacity) {
  const auto forward = boost::add_edge(from, to, g).first;
  const auto backward = boost::add_edge(to, from, g).first;
  boost::put(boost::edge_capacity, g, forward, capacity);
  boost::put(boost::edge_capacity, g, backward, 0);
  boost::put(boost::edge_reverse, g, forward, backward);
  boost::put(boost::edge_reverse, g, backward, forward);
}

// The largest total weight of a set of events closed under "happens before" (the empty set
// included): the positive weights less a minimum cut between them and the negative ones, whose
// infinite arcs "after needs before" no finite cut can cross.
std::int64_t max_weight_closure(const std::vector<std::int64_t>& weight,
                                const std::vector<Precedence>& order) {
  std::int64_t positive = 0;
  for (const std::int64_t w : weight) positive += std::max<std::int64_t>(w, 0);
  if (positive == 0) return 0;
  const int events = static_cast<int>(weight.size());
  const int source = events, sink = events + 1;
  FlowGraph g(static_cast<std::size_t>(events + 2));
  for (int e = 0; e < events; ++e) {
    if (weight[e] > 0) add_arc(g, source, e, weight[e]);
    if (weight[e] < 0) add_arc(g, e, sink, -weight[e]);
  }
  const std::int64_t unbounded = positive + 1;
  for (const Precedence& p : order) add_arc(g, p.after, p.before, unbounded);
  return positive - boost::boykov_kolmogorov_max_flow(g, source, sink);
}

}  // namespace

std::vector<std::int64_t> worst_order_peaks(const EventEngine& engine) {
  const std::vector<std::pair<int, int>> edges = engine.edges();
  std::vector<std::int64_t> peaks;
  for (int c = 0; c < static_cast<int>(engine.counter_count()); ++c) {
    const CounterEvents events = counter_events(engine, edges, c);
    peaks.push_back(engine.initial(c) + max_weight_closure(events.weight, events.order));
  }
  return peaks;
}

std::vector<std::int64_t> peaks_at_times(const EventEngine& engine,
                                         const std::vector<double>& start,
                                         const std::vector<double>& finish) {
  // At one instant, as the engine orders them: the frees of tasks that take time (ends, ends of
  // transients), then tasks without time (each start, transient and end in turn), then the
  // starts of tasks that take time (a transient that ends as its task starts, after that start).
  enum Phase { kFrees = 0, kInstantTask = 1, kStarts = 2, kAfterStart = 3 };
  struct Change {
    double time;
    Phase phase;
    std::int64_t delta;
    int counter;
  };
  std::vector<Change> changes;
  for (int t = 0; t < static_cast<int>(engine.task_count()); ++t) {
    const EventEngine::Effects e = engine.effects(t);
    const double simulated = engine.duration(t);
    const bool instant = finish[t] == start[t];
    if (e.start_counter >= 0) {
      changes.push_back(
          {start[t], instant ? kInstantTask : kStarts, e.start_bytes, e.start_counter});
      for (const auto& [freed, offset] :
           {std::pair{e.mid_bytes, e.mid_offset}, std::pair{e.late_bytes, e.late_offset}}) {
        if (freed == 0) continue;
        const double share = simulated > 0 ? std::min(offset, simulated) / simulated : 0.0;
        const double at = start[t] + share * (finish[t] - start[t]);
        changes.push_back({at,
                           instant          ? kInstantTask
                           : at == start[t] ? kAfterStart
                                            : kFrees,
                           -freed, e.start_counter});
      }
    }
    if (e.end_counter >= 0)
      changes.push_back({finish[t], instant ? kInstantTask : kFrees, -e.end_bytes, e.end_counter});
  }
  std::stable_sort(changes.begin(), changes.end(), [](const Change& a, const Change& b) {
    return a.time < b.time || (a.time == b.time && a.phase < b.phase);
  });
  std::vector<std::int64_t> value(engine.counter_count()), peak(engine.counter_count());
  for (std::size_t c = 0; c < value.size(); ++c)
    value[c] = peak[c] = engine.initial(static_cast<int>(c));
  for (const Change& c : changes) {
    value[c.counter] += c.delta;
    peak[c.counter] = std::max(peak[c.counter], value[c.counter]);
  }
  return peak;
}

}  // namespace pipetune
