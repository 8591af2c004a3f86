// What the timeline painter puts on pixels, checked at places computed from the geometry: task
// bodies in their kind's colour, other micro-batches faded while one is highlighted, measured
// bars in their error's colour.

#include "gui/model/timeline_painter.hpp"

#include <gtest/gtest.h>

#include <QImage>
#include <map>

#include "gui/model/palette.hpp"
#include "gui/model/plan_editor.hpp"
#include "tests/gui/gui_test_support.hpp"

namespace pipetune::gui {
namespace {

class TimelinePainterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    profile_ = load_profile(testing::data_path("tiny.profile.json"));
    hardware_ = load_hardware(testing::data_path("hardware-2.json"));
    plan_ = load_plan(testing::data_path("plan-2x4.json"));
    model_.set_prediction(testing::simulate_directly(profile_, hardware_, plan_));
  }

  QImage paint(const TimelineStyle& style, const char* name) {
    axis_.set_pixels(TimelineFrame::kGutterWidth, kWidth - TimelineFrame::kRightMargin);
    axis_.set_extent(model_.extent_ms());
    axis_.fit();
    layout_.build(model_, TimelineFrame::kRulerHeight, kHeight - TimelineFrame::kRulerHeight);
    QImage image(kWidth, kHeight, QImage::Format_RGB32);
    QPainter painter(&image);
    painter_.paint(painter, QRectF(0, 0, kWidth, kHeight), model_, axis_, layout_, style);
    painter.end();
    image.save(testing::output_dir() + "/" + name);
    return image;
  }

  // A pixel inside a task's bar, away from its label (centred) and its edges.
  QPoint inside(const TimelineTask& t) const {
    const Band& band = layout_.lane(t.lane);
    return QPoint(static_cast<int>(std::floor(axis_.to_x(t.start_ms))) + 3,
                  static_cast<int>(band.top) + 2);
  }
  bool wide(const TimelineTask& t) const {
    return axis_.to_x(t.end_ms) - axis_.to_x(t.start_ms) >= 10;
  }

  static constexpr int kWidth = 1400, kHeight = 360;
  QApplication& app_ = testing::app();  // first: the painter below needs fonts
  Profile profile_;
  Hardware hardware_;
  Plan plan_;
  TimelineModel model_;
  TimeAxis axis_;
  LaneLayout layout_;
  TimelinePainter painter_;
};

TEST_F(TimelinePainterTest, TasksAreFilledWithTheirKindsColour) {
  const QImage image = paint({}, "timeline-plain.png");
  int checked = 0;
  for (const TimelineTask& t : model_.tasks(Series::Predicted)) {
    if (!wide(t)) continue;
    EXPECT_EQ(image.pixelColor(inside(t)), palette::task(t.kind)) << t.label();
    ++checked;
  }
  EXPECT_GE(checked, 20);  // every compute task of this plan is wide at this size
  // Between the rows there is no task colour.
  const Band& row0 = layout_.row(0);
  EXPECT_EQ(image.pixelColor(kWidth / 2, static_cast<int>(row0.bottom()) + 2),
            palette::kBackground);
}

// Pixels of exactly `colour` in the legend (the ruler's corner over the gutter).
int legend_pixels(const QImage& image, const QColor& colour) {
  int count = 0;
  for (int y = 0; y < static_cast<int>(TimelineFrame::kRulerHeight); ++y) {
    for (int x = 0; x < static_cast<int>(TimelineFrame::kGutterWidth); ++x) {
      if (image.pixelColor(x, y) == colour) ++count;
    }
  }
  return count;
}

TEST_F(TimelinePainterTest, ZeroBubbleInputAndWeightGradientsAreDrawnAndNamed) {
  // Without them, the legend names no I or W.
  const QImage gpipe = paint({}, "timeline-gpipe-legend.png");
  EXPECT_EQ(legend_kinds(model_),
            (std::vector<TaskKind>{TaskKind::Forward, TaskKind::Recompute, TaskKind::Backward,
                                   TaskKind::SendActivation}));
  EXPECT_EQ(legend_pixels(gpipe, palette::task(TaskKind::InputGrad)), 0);
  EXPECT_EQ(legend_pixels(gpipe, palette::task(TaskKind::WeightGrad)), 0);
  EXPECT_EQ(legend_pixels(gpipe, palette::task(TaskKind::Backward)), 100);  // its 10 × 10 key

  PlanEditor editor;
  editor.open_profile(profile_, hardware_);
  ASSERT_TRUE(editor.set_schedule(ScheduleKind::InterleavedZB).isEmpty());
  ASSERT_EQ(editor.plan().stages(), 4);
  model_.set_prediction(editor.result());
  // Every stage splits every micro-batch's backward into one I and one W.
  const int micro_batches = model_.micro_batches();
  ASSERT_GT(micro_batches, 1);
  std::map<TaskKind, int> count;
  for (const TimelineTask& t : model_.tasks(Series::Predicted)) ++count[t.kind];
  EXPECT_EQ(count[TaskKind::InputGrad], 4 * micro_batches);
  EXPECT_EQ(count[TaskKind::WeightGrad], 4 * micro_batches);
  EXPECT_EQ(count[TaskKind::Forward], 4 * micro_batches);
  EXPECT_EQ(
      legend_kinds(model_),
      (std::vector<TaskKind>{TaskKind::Forward, TaskKind::Recompute, TaskKind::Backward,
                             TaskKind::InputGrad, TaskKind::WeightGrad, TaskKind::SendActivation}));

  const QImage image = paint({}, "timeline-interleaved-zb.png");
  std::map<TaskKind, int> checked;
  for (const TimelineTask& t : model_.tasks(Series::Predicted)) {
    if (!wide(t)) continue;
    EXPECT_EQ(image.pixelColor(inside(t)), palette::task(t.kind)) << t.label();
    ++checked[t.kind];
  }
  EXPECT_GE(checked[TaskKind::InputGrad], 1);
  EXPECT_GE(checked[TaskKind::WeightGrad], 1);
  // Each new key is a full 10 × 10 square in the legend.
  EXPECT_EQ(legend_pixels(image, palette::task(TaskKind::InputGrad)), 100);
  EXPECT_EQ(legend_pixels(image, palette::task(TaskKind::WeightGrad)), 100);
}

TEST_F(TimelinePainterTest, HighlightingAMicroBatchFadesTheOthers) {
  TimelineStyle style;
  style.highlighted_micro_batch = 2;
  const QImage image = paint(style, "timeline-highlight.png");
  int highlighted = 0, faded = 0;
  for (const TimelineTask& t : model_.tasks(Series::Predicted)) {
    if (!wide(t)) continue;
    const QColor expected =
        t.micro_batch == 2 ? palette::task(t.kind) : palette::faded(palette::task(t.kind));
    EXPECT_EQ(image.pixelColor(inside(t)), expected) << t.label();
    (t.micro_batch == 2 ? highlighted : faded) += 1;
  }
  EXPECT_GE(highlighted, 4);
  EXPECT_GE(faded, 12);
}

TEST_F(TimelinePainterTest, MeasuredBarsShowTheirErrorWhenAsked) {
  model_.set_measured(std::make_shared<Trace>(
      testing::make_measured_trace(profile_, hardware_, plan_, 1.3, 0.85, 25.0)));
  TimelineStyle style;
  style.colour_by_error = true;
  const QImage image = paint(style, "timeline-error-colours.png");
  int checked = 0;
  for (const TimelineTask& m : model_.tasks(Series::Measured)) {
    if (!wide(m) || m.match < 0) continue;
    // Skip bars that a predicted outline's edge crosses near the sampled pixel.
    const QPoint at = inside(m);
    bool crossed = false;
    for (int k : model_.lanes()[m.lane].of(Series::Predicted)) {
      const TimelineTask& p = model_.tasks(Series::Predicted)[k];
      for (double x : {axis_.to_x(p.start_ms), axis_.to_x(p.end_ms)})
        crossed |= std::abs(x - at.x()) < 4;
    }
    if (crossed) continue;
    EXPECT_EQ(image.pixelColor(at), palette::error(m.error)) << m.label();
    ++checked;
  }
  EXPECT_GE(checked, 8);
}

}  // namespace
}  // namespace pipetune::gui
