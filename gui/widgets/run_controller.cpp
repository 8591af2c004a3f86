#include "gui/widgets/run_controller.hpp"

#include <QCoreApplication>
#include <QFileInfo>

#include "sim/error.hpp"

namespace pipetune::gui {

RunController::RunController(QObject* parent)
    : QObject(parent),
      cli_(locate_pipetune_cli(QCoreApplication::applicationDirPath(),
                               qEnvironmentVariable("PIPETUNE_CLI"))) {}

RunController::~RunController() {
  if (process_) {
    process_->disconnect(this);
    process_->kill();
    process_->waitForFinished(2000);
  }
}

QString RunController::unavailable_reason(const Profile* profile) const {
  if (!profile) return tr("Open a profile first.");
  if (!model_spec_from_meta(profile->meta_json)) {
    return tr(
        "This profile does not say which model it measured (no \"model_spec\" in its "
        "meta; profiles written by `pipetune profile` have one), so `pipetune run` "
        "cannot build the model.");
  }
  if (cli_.isEmpty()) {
    return tr(
        "The pipetune command was not found: not in the build folder beside this app, not "
        "on PATH; set PIPETUNE_CLI to its path.");
  }
  return {};
}

bool RunController::start(const Profile& profile, const Plan& plan, int steps) {
  if (process_) return false;
  const QString reason = unavailable_reason(&profile);
  if (!reason.isEmpty()) {
    emit failed(reason);
    return false;
  }
  folder_ = std::make_unique<QTemporaryDir>();
  if (!folder_->isValid()) {
    emit failed(tr("cannot make a temporary folder: %1").arg(folder_->errorString()));
    return false;
  }
  const QString plan_path = folder_->filePath(QStringLiteral("plan.json"));
  trace_path_ = folder_->filePath(QStringLiteral("measured.trace.json"));
  try {
    save_plan(plan, plan_path.toStdString());
  } catch (const std::exception& e) {
    emit failed(QString::fromStdString(e.what()));
    return false;
  }
  reader_ = {};
  cancelled_ = false;
  process_ = new QProcess(this);
  process_->setProgram(cli_);
  process_->setArguments(run_arguments(*run_request(profile, plan_path, steps, trace_path_)));
  // stdout (the run's own report) is not needed; stderr carries progress and the reason.
  process_->setStandardOutputFile(QProcess::nullDevice());
  connect(process_, &QProcess::readyReadStandardError, this, [this] {
    if (reader_.feed(process_->readAllStandardError()) && reader_.progress()) {
      emit progressed(reader_.progress()->done, reader_.progress()->total);
    }
  });
  connect(process_, &QProcess::finished, this, &RunController::on_finished);
  connect(process_, &QProcess::errorOccurred, this, [this](QProcess::ProcessError error) {
    if (error != QProcess::FailedToStart) return;  // crashes arrive through finished()
    const QString reason = tr("cannot start %1: %2").arg(cli_, process_->errorString());
    process_->deleteLater();
    process_ = nullptr;
    emit failed(reason);
  });
  process_->start();
  return true;
}

void RunController::cancel() {
  if (!process_) return;
  cancelled_ = true;
  process_->terminate();
  if (!process_->waitForFinished(3000)) process_->kill();
}

void RunController::on_finished(int exit_code, QProcess::ExitStatus status) {
  if (reader_.feed(process_->readAllStandardError()) | reader_.finish()) {
    if (reader_.progress()) emit progressed(reader_.progress()->done, reader_.progress()->total);
  }
  process_->deleteLater();
  process_ = nullptr;
  if (cancelled_) {
    emit failed(tr("run cancelled"));
  } else if (status == QProcess::NormalExit && exit_code == 0) {
    if (QFileInfo::exists(trace_path_)) {
      emit succeeded(trace_path_);
    } else {
      emit failed(tr("pipetune run succeeded but wrote no trace to %1").arg(trace_path_));
    }
  } else {
    // The command's last stderr line is its reason.
    const QString last = reader_.last_line();
    const bool is_progress = parse_progress_line(last).has_value();
    if (status != QProcess::NormalExit) {
      emit failed(tr("pipetune run crashed") +
                  (last.isEmpty() || is_progress ? QString() : QStringLiteral(": ") + last));
    } else {
      emit failed(last.isEmpty() || is_progress
                      ? tr("pipetune run failed with exit status %1").arg(exit_code)
                      : last);
    }
  }
}

}  // namespace pipetune::gui
