#include "gui/widgets/planner_worker.hpp"

#include <exception>
#include <stdexcept>
#include <string>

#include "sim/planner/runtime_support.hpp"

namespace pipetune::gui {

namespace {
struct Cancelled {};
}  // namespace

PlannerWorker::PlannerWorker(QObject* parent) : QObject(parent) {
  qRegisterMetaType<std::shared_ptr<const pipetune::PlanSearchResult>>();
  qRegisterMetaType<std::shared_ptr<const std::vector<pipetune::IterationInterval>>>();
}

PlannerWorker::~PlannerWorker() {
  cancel();
  wait();
}

bool PlannerWorker::start(const Profile& profile, const Hardware& hardware,
                          PlannerOptions options) {
  if (running()) return false;
  cancel_ = std::make_shared<std::atomic<bool>>(false);
  auto flag = cancel_;
  // The destructor waits for the thread, so `this` outlives it; signals are emitted on the GUI
  // thread, where `this` lives.
  thread_ = QThread::create([this, flag, profile, hardware, options]() mutable {
    // Progress arrives once per configuration; throwing from it is how a search is stopped.
    options.progress = [this, flag](std::size_t done, std::size_t total) {
      if (flag->load()) throw Cancelled{};
      QMetaObject::invokeMethod(
          this,
          [this, done, total] { emit progressed(static_cast<int>(done), static_cast<int>(total)); },
          Qt::QueuedConnection);
    };
    try {
      // For torch's runtime, only plans torch runs (sim/planner/runtime_support.hpp).
      const std::string refused = keep_what_the_runtime_runs(options, hardware, profile);
      if (!refused.empty()) throw std::invalid_argument(refused);
      auto result =
          std::make_shared<const PlanSearchResult>(find_best_plans(profile, hardware, options));
      QMetaObject::invokeMethod(
          this, [this, result] { emit finished(result); }, Qt::QueuedConnection);
      if (result->ranked.empty()) return;
      std::vector<Plan> plans;
      for (const auto& c : result->ranked) plans.push_back(c.plan);
      std::shared_ptr<const std::vector<IterationInterval>> intervals =
          std::make_shared<const std::vector<IterationInterval>>(
              intervals_of(profile, hardware, static_cast<int>(hardware.devices.size()), plans));
      QMetaObject::invokeMethod(
          this, [this, intervals] { emit intervals_ready(intervals); }, Qt::QueuedConnection);
      // The alternatives' searches are small (an eighth of the budget each) and report no
      // progress, so they run to the end; a cancel meanwhile drops them.
      auto away = std::make_shared<OneChoiceAway>();
      away->best = result->ranked.front();
      away->alternatives = one_choice_away(profile, hardware, options, away->best);
      if (flag->load()) return;
      std::shared_ptr<const OneChoiceAway> explained_away = std::move(away);
      QMetaObject::invokeMethod(
          this, [this, explained_away] { emit explained(explained_away); }, Qt::QueuedConnection);
    } catch (const Cancelled&) {
      QMetaObject::invokeMethod(
          this, [this] { emit cancelled(); }, Qt::QueuedConnection);
    } catch (const std::exception& e) {
      const QString reason = QString::fromStdString(e.what());
      QMetaObject::invokeMethod(
          this, [this, reason] { emit failed(reason); }, Qt::QueuedConnection);
    }
  });
  thread_->setParent(this);
  QThread* thread = thread_;
  connect(thread, &QThread::finished, this, [this, thread] {
    if (thread_ == thread) thread_ = nullptr;
    thread->deleteLater();
  });
  thread_->start();
  return true;
}

void PlannerWorker::cancel() {
  if (cancel_) cancel_->store(true);
}

void PlannerWorker::wait() {
  if (thread_) thread_->wait();
}

}  // namespace pipetune::gui
