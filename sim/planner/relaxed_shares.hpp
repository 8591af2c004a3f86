#pragma once
// The relaxed roots' shared vocabulary (docs/planner.md, "The relaxed root"): layers grouped into
// classes by how their costs relate to their work, the contiguity a stage's share keeps, and the
// least that boundaries' copies cost. The single-stage roots (relaxed_root.cpp) and the
// multi-stage ones (multi_stage_root.cpp) both price their shares with these.

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <set>
#include <vector>

#include "sim/cost_model.hpp"
#include "sim/hardware.hpp"
#include "sim/planner/minimax_bound.hpp"
#include "sim/planner/root_programme.hpp"
#include "sim/planner/tuning.hpp"

namespace pipetune::planning {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// The relaxed roots' view of layers (docs/planner.md, "The relaxed root"): each layer's costs
// against its work, the least ratio bounding what a bound adds and the largest what it
// subtracts, per class of layers; layers without work add their quantity to the largest.
struct ClassRatio {
  std::vector<double> least, most;
  double workless = 0.0;
  explicit ClassRatio(int classes = 1) : least(classes, kInf), most(classes, 0.0) {}
  void add(int cls, double value, double work) {
    if (work > 0.0) {
      least[cls] = std::min(least[cls], value / work);
      most[cls] = std::max(most[cls], value / work);
    } else {
      workless += value;
    }
  }
  double lower(int cls) const { return least[cls] < kInf ? least[cls] : 0.0; }
};

// Layers grouped by the share of their forward in forward plus backward: one least ratio for
// all layers is loose when an embedding's backward is ten times its forward and a block's
// twice, so each class (a kind of layer, in most models) gets its own ratios and its own share
// of the work.
struct RatioClasses {
  std::vector<int> of;       // per layer
  std::vector<double> work;  // per class: its layers' work
};
// The single-stage relaxed root's classes: as many as keep its programme near kRatioCoordinates
// coordinates (stages x classes), within [kFewestRatioClasses, kMostRatioClasses].
inline int max_ratio_classes(int stages) {
  return std::clamp(kRatioCoordinates / std::max(stages, 1), kFewestRatioClasses,
                    kMostRatioClasses);
}
// EqualRanges: `max_classes` equal ranges of the share, the empty ones dropped (what the
// multi-stage roots use). LeastLoss: at most `max_classes` classes, each split where its layers
// lose most (their work times the class's width of shares; see ratio_classes()).
enum class ClassSplit { EqualRanges, LeastLoss };
RatioClasses ratio_classes(const std::vector<double>& layer_work, const SizeCosts& size,
                           int max_classes, ClassSplit split);

// A stage's tasks on a path priced together: per class, the least over its layers of what
// `counts[q]` tasks of each kind q cost on the layer (`cost(q, x)`) against its work. At least
// the sum of the kinds' own least ratios, and tighter when they vary unlike each other.
template <std::size_t Kinds, typename Cost>
std::vector<double> joint_least_ratios(const std::array<int, Kinds>& counts, Cost cost,
                                       const RatioClasses& classes,
                                       const std::vector<double>& layer_work) {
  ClassRatio r(static_cast<int>(classes.work.size()));
  for (std::size_t x = 0; x < layer_work.size(); ++x) {
    double sum = 0.0;
    for (std::size_t q = 0; q < Kinds; ++q)
      if (counts[q] > 0) sum += counts[q] * cost(static_cast<int>(q), static_cast<int>(x));
    r.add(classes.of[x], sum, layer_work[x]);
  }
  std::vector<double> least(classes.work.size());
  for (std::size_t c = 0; c < least.size(); ++c) least[c] = r.lower(static_cast<int>(c));
  return least;
}

// Contiguity for a relaxed root's shares (one block of stages per class, as
// MinMaxShareProgramme lays them out). The shares let a stage hold any mix of the classes, but
// a stage is a run of layers: after each stage end the work of class c so far and the work of
// all classes so far are a point of the model's own curve (T(e), C_c(e)) over the layer
// boundaries e, so within its convex hull. Each edge of the hull's lower (upper) side is a line
// such a point stays on or above (below): a linear constraint on the shares.
class ContiguityHull {
 public:
  ContiguityHull(const std::vector<double>& layer_work, const RatioClasses& classes);
  /// Adds to `programme` the edge constraints that `shares` (of `stages` stages) cross by more
  /// than a billionth of the work, one per stage end, class and side; returns how many.
  int add_crossed(MinMaxShareProgramme& programme, const std::vector<double>& shares, int stages);
  int add_crossed(RootProgramme& programme, const std::vector<double>& shares, int stages);

 private:
  template <typename Programme>
  int add_crossed_to(Programme& programme, const std::vector<double>& shares, int stages);

  struct Side {
    std::vector<double> t, c;  // vertices, t increasing
  };
  std::vector<Side> lower_, upper_;  // per class; empty with one class
  double slack_ = 0.0;
  std::set<std::array<int, 4>> added_;  // (stage end, class, side, edge) of the cuts so far
};

// The balance whose stage ends lie nearest the running sums of `share` (a relaxed root's share
// of the work per stage) on `work`, the prefix sums of the layers' work; every stage keeps a
// layer. A first plan near the relaxed root's bound.
std::vector<int> rounded_balance(const std::vector<double>& work, const std::vector<double>& share);

// The fewest bytes a stage boundary can carry at a micro-batch size: the least output of a
// layer with a layer after it; infinity with one layer.
double least_boundary_bytes(const SizeCosts& size);

// The least that a path's copies cost beyond their latencies over every balance. Stage ends
// strictly increase, so the boundaries of a balance carry the outputs of as many distinct
// layers (each with a layer after it); boundary k's copies at one micro-batch size cost
// weight[k] (milliseconds per byte, summed over them) times its output. By the rearrangement
// inequality the heaviest weights take the smallest outputs: `ascending` holds every output a
// boundary can carry at that size, smallest first.
double least_boundary_copies_ms(std::vector<double> weight, const std::vector<double>& ascending);

// A copy's milliseconds per byte over `link` (beyond its latency).
inline double ms_per_byte(const Link& link) {
  return link.bandwidth_bytes_per_s == std::numeric_limits<double>::infinity()
             ? 0.0
             : 1e3 / link.bandwidth_bytes_per_s;
}

// Some stage holds the heaviest layer whole, which continuous shares need not: the least over
// the stages of the programme with that stage's share of the layer's class at least the layer's
// work. Only where the layer is a sizeable part of a stage's share (a quarter or more), since it
// costs a fresh programme per stage and moves nothing otherwise. `floor`: the bound the caller
// has; as soon as one stage's programme is no higher, neither is the least, and it returns 0
// (the stage whose share of the class is largest in `shares` first, the likeliest to take the
// layer at no cost: on 3,000 layers and 32 stages the full loop was most of a plan's time).
double heaviest_layer_bound(const MinMaxShareProgramme& programme,
                            const std::vector<double>& layer_work, const RatioClasses& classes,
                            int stages, const std::vector<double>& shares, double floor,
                            std::uint64_t* cells = nullptr);
double heaviest_layer_bound(const RootProgramme& programme, const std::vector<double>& layer_work,
                            const RatioClasses& classes, int stages,
                            const std::vector<double>& shares, double floor,
                            std::uint64_t* cells = nullptr);
// Whether heaviest_layer_bound() would look at the stages at all.
bool heaviest_layer_matters(const std::vector<double>& layer_work, int stages);

}  // namespace pipetune::planning
