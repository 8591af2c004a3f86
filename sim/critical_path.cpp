#include "sim/critical_path.hpp"

// Boost.Graph stays in this one file: it is heavy to compile.
#include <algorithm>
#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/dag_shortest_paths.hpp>
#include <functional>
#include <limits>
#include <stdexcept>

namespace pipetune {

std::vector<int> critical_path(const SimulationResult& result) {
  using Graph =
      boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS, boost::no_property,
                            boost::property<boost::edge_weight_t, double>>;
  const int n = static_cast<int>(result.tasks.size());
  if (n == 0) return {};
  if (result.edges.empty() && n > 1) {
    throw std::logic_error("critical_path: simulate with record_edges to get the task graph");
  }
  // Vertex n is a source before every task, n + 1 a sink after every task. An edge u -> v
  // weighs u's duration, so a path's weight is the time its tasks take.
  const int source = n, sink = n + 1;
  Graph graph(n + 2);
  for (int t = 0; t < n; ++t) {
    boost::add_edge(source, t, 0.0, graph);
    boost::add_edge(t, sink, result.tasks[t].duration_ms(), graph);
  }
  for (const auto& [before, after] : result.edges) {
    boost::add_edge(before, after, result.tasks[before].duration_ms(), graph);
  }

  std::vector<double> distance(n + 2);
  std::vector<Graph::vertex_descriptor> predecessor(n + 2);
  for (int v = 0; v < n + 2; ++v) predecessor[v] = v;
  // Longest path in a DAG: shortest path with the comparison reversed.
  boost::dag_shortest_paths(graph, source,
                            boost::distance_map(distance.data())
                                .predecessor_map(predecessor.data())
                                .distance_compare(std::greater<double>())
                                .distance_inf(-std::numeric_limits<double>::infinity())
                                .distance_zero(0.0));

  std::vector<int> path;
  for (auto v = predecessor[sink]; v != static_cast<Graph::vertex_descriptor>(source);
       v = predecessor[v]) {
    path.push_back(static_cast<int>(v));
    if (predecessor[v] == v) break;
  }
  std::reverse(path.begin(), path.end());
  return path;
}

}  // namespace pipetune
