#include "gui/model/time_axis.hpp"

#include <algorithm>
#include <cmath>

namespace pipetune::gui {

void TimeAxis::set_pixels(double left, double right) {
  left_ = left;
  right_ = std::max(right, left + 1.0);
  clamp_and_update();
}

void TimeAxis::set_extent(double extent_ms) {
  extent_ms_ = std::max(extent_ms, kMinSpanMs);
  if (fitted_) {
    view_ = {0.0, extent_ms_};
  }
  clamp_and_update();
}

void TimeAxis::set_view(const TimeRange& view) {
  view_ = view;
  fitted_ = false;
  clamp_and_update();
}

void TimeAxis::fit() {
  view_ = {0.0, extent_ms_};
  fitted_ = true;
  clamp_and_update();
}

void TimeAxis::zoom(double factor, double anchor_x) {
  if (!(factor > 0)) return;
  const double anchor_ms = to_ms(anchor_x);
  const double span = view_.span() / factor;
  const double share = (anchor_x - left_) / (right_ - left_);
  view_ = {anchor_ms - share * span, anchor_ms + (1.0 - share) * span};
  fitted_ = false;
  clamp_and_update();
}

void TimeAxis::pan_pixels(double dx) {
  const double shift = dx / pixels_per_ms_;
  view_ = {view_.start_ms + shift, view_.end_ms + shift};
  fitted_ = false;
  clamp_and_update();
}

bool TimeAxis::zoom_to_pixels(double x0, double x1) {
  if (std::fabs(x1 - x0) < 3.0) return false;
  const double a = to_ms(std::min(x0, x1)), b = to_ms(std::max(x0, x1));
  set_view({a, b});
  return true;
}

void TimeAxis::clamp_and_update() {
  // Never narrower than kMinSpanMs, never much wider than the data; a small margin either side
  // lets the first and last task sit off the edges.
  const double margin = 0.02 * extent_ms_;
  const double widest = extent_ms_ + 2 * margin;
  double span = std::clamp(view_.span(), kMinSpanMs, widest);
  if (!std::isfinite(span)) span = extent_ms_;
  double start = std::isfinite(view_.start_ms) ? view_.start_ms : 0.0;
  if (view_.span() != span) start = 0.5 * (view_.start_ms + view_.end_ms) - 0.5 * span;
  if (fitted_) {
    start = 0.0, span = extent_ms_;
  } else {
    start = std::clamp(start, -margin, extent_ms_ + margin - span);
  }
  view_ = {start, start + span};
  pixels_per_ms_ = (right_ - left_) / span;
}

double TimeAxis::tick_step(double min_spacing_px) const {
  const double raw = min_spacing_px / pixels_per_ms_;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double multiple : {1.0, 2.0, 5.0, 10.0}) {
    if (multiple * power >= raw * (1 - 1e-9)) return multiple * power;
  }
  return 10.0 * power;
}

std::vector<Tick> TimeAxis::ticks(double min_spacing_px) const {
  const double step = tick_step(min_spacing_px);
  std::vector<Tick> out;
  const long long first = static_cast<long long>(std::ceil(view_.start_ms / step - 1e-9));
  for (long long k = first;; ++k) {
    const double ms = static_cast<double>(k) * step;
    if (ms > view_.end_ms + step * 1e-9) break;
    out.push_back({ms, to_x(ms)});
  }
  return out;
}

void ZoomHistory::push(const TimeRange& view) {
  if (!views_.empty() && views_.back() == view) return;
  if (views_.size() == kLimit) views_.erase(views_.begin());
  views_.push_back(view);
}

std::optional<TimeRange> ZoomHistory::pop() {
  if (views_.empty()) return std::nullopt;
  const TimeRange view = views_.back();
  views_.pop_back();
  return view;
}

}  // namespace pipetune::gui
