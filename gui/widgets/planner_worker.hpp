#pragma once

// Runs the planner (sim/planner/planner.hpp find_best_plans) on a thread of its own so the window
// stays responsive; its progress callback and its result come back to the GUI thread as signals.
// Then, on the same thread, the best plan with each of its choices changed
// (sim/planner/one_choice_away.hpp). The search works on copies of the profile and hardware, so
// edits made meanwhile do not race it. Cancelling stops it at the next configuration.

#include <QObject>
#include <QThread>
#include <atomic>
#include <memory>

#include "gui/model/one_choice_rows.hpp"
#include "sim/hardware.hpp"
#include "sim/interval.hpp"
#include "sim/planner/planner.hpp"
#include "sim/profile.hpp"

namespace pipetune::gui {

class PlannerWorker : public QObject {
  Q_OBJECT

 public:
  explicit PlannerWorker(QObject* parent = nullptr);
  ~PlannerWorker() override;

  bool running() const { return thread_ != nullptr && !thread_->isFinished(); }
  /// Starts a search; false when one is already running.
  bool start(const Profile& profile, const Hardware& hardware, PlannerOptions options);
  void cancel();
  /// Blocks until the running search (if any) has ended; for tests and shutdown.
  void wait();

 signals:
  void progressed(int done, int total);
  void finished(std::shared_ptr<const pipetune::PlanSearchResult> result);
  /// Right after `finished`: each ranked plan's 80 % interval, in the ranking's order (of zero
  /// width where neither the profile has spreads nor the hardware a model error).
  void intervals_ready(std::shared_ptr<const std::vector<pipetune::IterationInterval>> intervals);
  /// After `finished` when it ranked a plan: that plan with each choice changed, re-planned.
  /// Not sent when cancelled meanwhile (the re-planning itself runs to its end).
  void explained(std::shared_ptr<const pipetune::gui::OneChoiceAway> away);
  void failed(const QString& reason);
  void cancelled();

 private:
  QThread* thread_ = nullptr;
  std::shared_ptr<std::atomic<bool>> cancel_;
};

}  // namespace pipetune::gui
