#pragma once

// Runs `pipetune run` for the current plan in the background with QProcess (gui/model's
// run_command.hpp has the contract), follows its progress lines and hands back the measured
// trace it wrote, or the reason it failed.

#include <QObject>
#include <QProcess>
#include <QString>
#include <QTemporaryDir>
#include <memory>

#include "gui/model/run_command.hpp"
#include "sim/plan.hpp"
#include "sim/profile.hpp"

namespace pipetune::gui {

class RunController : public QObject {
  Q_OBJECT

 public:
  explicit RunController(QObject* parent = nullptr);
  ~RunController() override;

  /// The `pipetune` command found by locate_pipetune_cli (empty: none).
  const QString& cli() const { return cli_; }
  void set_cli(const QString& cli) { cli_ = cli; }
  /// Why a run cannot start for this profile; empty when it can.
  QString unavailable_reason(const Profile* profile) const;

  bool running() const { return process_ != nullptr; }
  /// Writes the plan to a temporary folder and starts the command; false (and failed()) when
  /// it cannot.
  bool start(const Profile& profile, const Plan& plan, int steps);
  void cancel();
  const std::optional<RunProgress>& progress() const { return reader_.progress(); }

 signals:
  void progressed(int done, int total);
  void succeeded(const QString& trace_path);
  void failed(const QString& reason);

 private:
  void on_finished(int exit_code, QProcess::ExitStatus status);

  QString cli_;
  QProcess* process_ = nullptr;
  std::unique_ptr<QTemporaryDir> folder_;
  QString trace_path_;
  ProgressReader reader_;
  bool cancelled_ = false;
};

}  // namespace pipetune::gui
