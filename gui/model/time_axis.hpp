#pragma once

// The mapping between time (ms from the iteration's start) and horizontal pixels that the
// timeline and the memory chart share, with zoom, pan and the ruler's ticks.

#include <optional>
#include <vector>

namespace pipetune::gui {

struct TimeRange {
  double start_ms = 0.0;
  double end_ms = 1.0;
  double span() const { return end_ms - start_ms; }
  bool operator==(const TimeRange&) const = default;
};

struct Tick {
  double ms = 0.0;
  double x = 0.0;
};

class TimeAxis {
 public:
  /// Pixels [left, right) show the view.
  void set_pixels(double left, double right);
  /// The data's time range is [0, extent]; the view may not wander far outside it.
  void set_extent(double extent_ms);
  void set_view(const TimeRange& view);
  /// The whole extent; later extent changes keep the view fitted until the user zooms or pans.
  void fit();

  double to_x(double ms) const { return left_ + (ms - view_.start_ms) * pixels_per_ms_; }
  double to_ms(double x) const { return view_.start_ms + (x - left_) / pixels_per_ms_; }
  double pixels_per_ms() const { return pixels_per_ms_; }
  double left() const { return left_; }
  double right() const { return right_; }
  double extent_ms() const { return extent_ms_; }
  const TimeRange& view() const { return view_; }
  bool fitted() const { return fitted_; }

  /// factor > 1 zooms in; the time under `anchor_x` stays under it (unless clamping moves it).
  void zoom(double factor, double anchor_x);
  void pan_pixels(double dx);
  /// The view between two pixel positions (either order); ignored when they are too close.
  bool zoom_to_pixels(double x0, double x1);

  /// Ticks at 1, 2 or 5 times a power of ten, at least `min_spacing_px` apart, inside the view.
  std::vector<Tick> ticks(double min_spacing_px) const;
  /// The step ticks(min_spacing_px) uses.
  double tick_step(double min_spacing_px) const;

  /// The narrowest view: 100 ns, below any task a profiler resolves.
  static constexpr double kMinSpanMs = 1e-4;

 private:
  void clamp_and_update();

  double left_ = 0.0, right_ = 1.0;
  double extent_ms_ = 1.0;
  TimeRange view_{0.0, 1.0};
  double pixels_per_ms_ = 1.0;
  bool fitted_ = true;
};

/// Views the user zoomed away from, newest last, for "undo zoom".
class ZoomHistory {
 public:
  void push(const TimeRange& view);
  std::optional<TimeRange> pop();
  bool empty() const { return views_.empty(); }
  std::size_t size() const { return views_.size(); }
  void clear() { views_.clear(); }

  static constexpr std::size_t kLimit = 64;

 private:
  std::vector<TimeRange> views_;
};

}  // namespace pipetune::gui
