#include "sim/order_peak.hpp"

#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/push_relabel_max_flow.hpp>

namespace pipetune {
namespace {

using Traits = boost::adjacency_list_traits<boost::vecS, boost::vecS, boost::directedS>;
using FlowGraph = boost::adjacency_list<
    boost::vecS, boost::vecS, boost::directedS, boost::no_property,
    boost::property<
        boost::edge_capacity_t, std::int64_t,
        boost::property<boost::edge_residual_capacity_t, std::int64_t,
                        boost::property<boost::edge_reverse_t, Traits::edge_descriptor>>>>;

// Task k's events: 3k its start, 3k + 1 the end of its transient peak, 3k + 2 its end.
constexpr int kEventsPerTask = 3;

struct Precedence {
  int before = 0, after = 0;  // events
};

// "before happens before after": within a task, start, peak end, end; across an edge, the
// earlier task's end before the later one's start.
std::vector<Precedence> event_order(const EventEngine& engine) {
  std::vector<Precedence> order;
  const int n = static_cast<int>(engine.task_count());
  for (int k = 0; k < n; ++k) {
    order.push_back({kEventsPerTask * k, kEventsPerTask * k + 1});
    order.push_back({kEventsPerTask * k + 1, kEventsPerTask * k + 2});
  }
  for (const auto& [a, b] : engine.edges()) {
    order.push_back({kEventsPerTask * a + 2, kEventsPerTask * b});
  }
  return order;
}

// What each event adds to `counter`.
std::vector<std::int64_t> event_weights(const EventEngine& engine, int counter) {
  const int n = static_cast<int>(engine.task_count());
  std::vector<std::int64_t> weight(static_cast<std::size_t>(kEventsPerTask * n), 0);
  for (int k = 0; k < n; ++k) {
    const EventEngine::Effects e = engine.effects(k);
    if (e.start_counter == counter) {
      weight[kEventsPerTask * k] += e.start_bytes;
      weight[kEventsPerTask * k + 1] -= e.mid_bytes;
    }
    if (e.end_counter == counter) weight[kEventsPerTask * k + 2] -= e.end_bytes;
  }
  return weight;
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
  return positive - boost::push_relabel_max_flow(g, source, sink);
}

}  // namespace

std::vector<std::int64_t> worst_order_peaks(const EventEngine& engine) {
  const std::vector<Precedence> order = event_order(engine);
  std::vector<std::int64_t> peaks;
  for (int c = 0; c < static_cast<int>(engine.counter_count()); ++c) {
    peaks.push_back(engine.initial(c) + max_weight_closure(event_weights(engine, c), order));
  }
  return peaks;
}

}  // namespace pipetune
