#include "gui/model/cost_strip_geometry.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace pipetune::gui {

void CostStripGeometry::build(std::vector<double> layer_ms, std::vector<int> balance,
                              const QRectF& plot, std::vector<double> stage_ms) {
  layer_ms_ = std::move(layer_ms);
  stage_ms_ = stage_ms.size() == balance.size() ? std::move(stage_ms) : std::vector<double>{};
  balance_ = std::move(balance);
  plot_ = plot;
  first_.assign(balance_.size() + 1, 0);
  for (std::size_t s = 0; s < balance_.size(); ++s) first_[s + 1] = first_[s] + balance_[s];
  column_width_ = layer_ms_.empty() ? 1.0 : plot_.width() / static_cast<double>(layer_ms_.size());
  max_ms_ = 0.0;
  for (double ms : layer_ms_) max_ms_ = std::max(max_ms_, ms);
  if (max_ms_ <= 0) max_ms_ = 1.0;
}

QRectF CostStripGeometry::column(int layer) const {
  return QRectF(plot_.left() + layer * column_width_, plot_.top(), column_width_, plot_.height());
}

QRectF CostStripGeometry::bar(int layer) const {
  const QRectF c = column(layer);
  const double height = layer_ms_[layer] / max_ms_ * c.height();
  const double inset = column_width_ >= 6 ? std::min(column_width_ * 0.15, 6.0) : 0.0;
  return QRectF(c.left() + inset, c.bottom() - height, c.width() - 2 * inset, height);
}

int CostStripGeometry::layer_at(double x) const {
  if (x < plot_.left() || x >= plot_.right() || layer_ms_.empty()) return -1;
  return std::min(layer_count() - 1, static_cast<int>((x - plot_.left()) / column_width_));
}

QRectF CostStripGeometry::stage_span(int stage) const {
  const double left = plot_.left() + first_[stage] * column_width_;
  return QRectF(left, plot_.top(), balance_[stage] * column_width_, plot_.height());
}

double CostStripGeometry::stage_ms(int stage) const {
  if (!stage_ms_.empty()) return stage_ms_[stage];
  return std::accumulate(layer_ms_.begin() + first_[stage], layer_ms_.begin() + first_[stage + 1],
                         0.0);
}

double CostStripGeometry::boundary_x(int boundary) const {
  return plot_.left() + first_[boundary + 1] * column_width_;
}

int CostStripGeometry::boundary_at(double x, double tolerance) const {
  int best = -1;
  double best_distance = tolerance;
  for (int b = 0; b + 1 < stage_count(); ++b) {
    const double distance = std::fabs(boundary_x(b) - x);
    if (distance <= best_distance) best = b, best_distance = distance;
  }
  return best;
}

int CostStripGeometry::gap_at(double x) const {
  const int gap = static_cast<int>(std::lround((x - plot_.left()) / column_width_));
  return std::clamp(gap, 1, std::max(1, layer_count() - 1));
}

std::vector<int> CostStripGeometry::move_boundary(const std::vector<int>& balance, int boundary,
                                                  int gap) {
  std::vector<int> out = balance;
  if (boundary < 0 || boundary + 1 >= static_cast<int>(balance.size())) return out;
  int first = 0;
  for (int s = 0; s < boundary; ++s) first += balance[s];
  const int end = first + balance[boundary] + balance[boundary + 1];
  const int clamped = std::clamp(gap, first + 1, end - 1);
  out[boundary] = clamped - first;
  out[boundary + 1] = end - clamped;
  return out;
}

}  // namespace pipetune::gui
