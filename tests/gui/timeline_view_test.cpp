// The timeline widget's mouse and keys under the offscreen platform, checked against the axis
// arithmetic: what a wheel, a drag, a selection, an undo and a click must do.

#include "gui/widgets/timeline_view.hpp"

#include <gtest/gtest.h>

#include <QKeyEvent>
#include <QMouseEvent>
#include <QWheelEvent>

#include "tests/gui/gui_test_support.hpp"

namespace pipetune::gui {
namespace {

class TimelineViewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::app();
    const Profile profile = load_profile(testing::data_path("tiny.profile.json"));
    const Hardware hardware = load_hardware(testing::data_path("hardware-2.json"));
    const Plan plan = load_plan(testing::data_path("plan-2x4.json"));
    model_.set_prediction(testing::simulate_directly(profile, hardware, plan));
    view_ = std::make_unique<TimelineView>(model_);
    view_->resize(1200, 400);
    view_->show();
    view_->model_changed();
  }

  void mouse(QEvent::Type type, QPointF at, Qt::MouseButton button,
             Qt::KeyboardModifiers mods = {}) {
    QMouseEvent event(type, at, view_->mapToGlobal(at), button,
                      type == QEvent::MouseButtonRelease ? Qt::NoButton : Qt::MouseButtons(button),
                      mods);
    QApplication::sendEvent(view_.get(), &event);
  }
  void key(int k, Qt::KeyboardModifiers mods = {}) {
    QKeyEvent event(QEvent::KeyPress, k, mods);
    QApplication::sendEvent(view_.get(), &event);
  }

  TimelineModel model_;
  std::unique_ptr<TimelineView> view_;
};

TEST_F(TimelineViewTest, WheelZoomsAroundTheCursor) {
  const TimeAxis& axis = view_->axis();
  const double span = axis.view().span();
  const QPointF at(700, 100);
  const double under = axis.to_ms(at.x());
  QWheelEvent wheel(at, view_->mapToGlobal(at), {}, QPoint(0, 120), Qt::NoButton, Qt::NoModifier,
                    Qt::NoScrollPhase, false);
  QApplication::sendEvent(view_.get(), &wheel);
  EXPECT_NEAR(axis.view().span(), span / 1.25, 1e-9);
  EXPECT_NEAR(axis.to_ms(at.x()), under, 1e-9);
}

TEST_F(TimelineViewTest, KeysZoomPanAndFit) {
  const TimeAxis& axis = view_->axis();
  const TimeRange fitted = axis.view();
  key(Qt::Key_W);
  EXPECT_NEAR(axis.view().span(), fitted.span() / 1.25, 1e-9);
  key(Qt::Key_Plus);
  key(Qt::Key_Equal);
  EXPECT_NEAR(axis.view().span(), fitted.span() / (1.25 * 1.25 * 1.25), 1e-9);
  const double start = axis.view().start_ms;  // far enough from the end to pan freely
  key(Qt::Key_D);
  EXPECT_NEAR(axis.view().start_ms, start + 0.2 * axis.view().span(), 1e-9);
  key(Qt::Key_A);
  EXPECT_NEAR(axis.view().start_ms, start, 1e-9);
  key(Qt::Key_S);
  EXPECT_NEAR(axis.view().span(), fitted.span() / (1.25 * 1.25), 1e-9);
  key(Qt::Key_0);
  EXPECT_EQ(axis.view(), fitted);
}

TEST_F(TimelineViewTest, DragPansByThePixelsMoved) {
  const TimeAxis& axis = view_->axis();
  key(Qt::Key_W);
  key(Qt::Key_W);
  const double start = axis.view().start_ms;
  const double per_pixel = 1.0 / axis.pixels_per_ms();
  mouse(QEvent::MouseButtonPress, {600, 100}, Qt::LeftButton);
  mouse(QEvent::MouseMove, {560, 100}, Qt::LeftButton);
  mouse(QEvent::MouseMove, {500, 100}, Qt::LeftButton);
  mouse(QEvent::MouseButtonRelease, {500, 100}, Qt::LeftButton);
  EXPECT_NEAR(axis.view().start_ms, start + 100 * per_pixel, 1e-9);
}

TEST_F(TimelineViewTest, SelectionZoomsToItAndUndoComesBack) {
  const TimeAxis& axis = view_->axis();
  const TimeRange before = axis.view();
  const double a = axis.to_ms(400), b = axis.to_ms(800);
  mouse(QEvent::MouseButtonPress, {400, 100}, Qt::RightButton);
  mouse(QEvent::MouseMove, {600, 100}, Qt::RightButton);
  mouse(QEvent::MouseMove, {800, 100}, Qt::RightButton);
  mouse(QEvent::MouseButtonRelease, {800, 100}, Qt::RightButton);
  EXPECT_NEAR(axis.view().start_ms, a, 1e-9);
  EXPECT_NEAR(axis.view().end_ms, b, 1e-9);
  EXPECT_TRUE(view_->can_undo_zoom());
  // A second selection, with Shift and the left button, then two undos.
  const TimeRange first = axis.view();
  mouse(QEvent::MouseButtonPress, {300, 100}, Qt::LeftButton, Qt::ShiftModifier);
  mouse(QEvent::MouseMove, {500, 100}, Qt::LeftButton, Qt::ShiftModifier);
  mouse(QEvent::MouseButtonRelease, {500, 100}, Qt::LeftButton, Qt::ShiftModifier);
  EXPECT_LT(axis.view().span(), first.span());
  key(Qt::Key_Backspace);
  EXPECT_NEAR(axis.view().start_ms, first.start_ms, 1e-9);
  EXPECT_NEAR(axis.view().end_ms, first.end_ms, 1e-9);
  key(Qt::Key_Z, Qt::ControlModifier);
  EXPECT_EQ(axis.view(), before);
  EXPECT_TRUE(axis.fitted());
  EXPECT_FALSE(view_->can_undo_zoom());
}

TEST_F(TimelineViewTest, ClickingATaskHighlightsItsMicroBatch) {
  const TimeAxis& axis = view_->axis();
  const LaneLayout& layout = view_->layout();
  int clicked = 0;
  for (const TimelineTask& t : model_.tasks(Series::Predicted)) {
    if (t.is_copy() || axis.to_x(t.end_ms) - axis.to_x(t.start_ms) < 6) continue;
    const Band& band = layout.lane(t.lane);
    const QPointF at(0.5 * (axis.to_x(t.start_ms) + axis.to_x(t.end_ms)),
                     band.top + band.height / 2);
    const auto hit = view_->task_at(at);
    ASSERT_TRUE(hit);
    EXPECT_EQ(model_.task(*hit).label(), t.label());
    mouse(QEvent::MouseButtonPress, at, Qt::LeftButton);
    mouse(QEvent::MouseButtonRelease, at, Qt::LeftButton);
    EXPECT_EQ(view_->style().highlighted_micro_batch, t.micro_batch);
    ++clicked;
  }
  EXPECT_GE(clicked, 20);
  // A click below every lane clears it; so does Esc.
  const QPointF empty(600, layout.row(layout.row_count() - 1).bottom() + 20);
  ASSERT_LT(empty.y(), view_->height());
  mouse(QEvent::MouseButtonPress, empty, Qt::LeftButton);
  mouse(QEvent::MouseButtonRelease, empty, Qt::LeftButton);
  EXPECT_EQ(view_->style().highlighted_micro_batch, -1);
  view_->highlight_micro_batch(1);
  key(Qt::Key_Escape);
  EXPECT_EQ(view_->style().highlighted_micro_batch, -1);
}

}  // namespace
}  // namespace pipetune::gui
