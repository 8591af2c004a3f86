#include "gui/model/run_command.hpp"

#include <QDir>
#include <QFileInfo>
#include <QJsonDocument>
#include <QJsonObject>
#include <QStandardPaths>

namespace pipetune::gui {

std::optional<QString> model_spec_from_meta(const std::string& meta_json) {
  if (meta_json.empty()) return std::nullopt;
  const QJsonDocument document = QJsonDocument::fromJson(QByteArray::fromStdString(meta_json));
  if (!document.isObject()) return std::nullopt;
  const QJsonValue spec = document.object().value(QStringLiteral("model_spec"));
  if (!spec.isString() || spec.toString().trimmed().isEmpty()) return std::nullopt;
  return spec.toString();
}

QStringList run_arguments(const RunRequest& r) {
  QStringList args = {QStringLiteral("run"),
                      QStringLiteral("--model"),
                      r.model_spec,
                      QStringLiteral("--plan"),
                      r.plan_path,
                      QStringLiteral("--steps"),
                      QString::number(r.steps),
                      QStringLiteral("--trace"),
                      r.trace_path,
                      QStringLiteral("--progress"),
                      QStringLiteral("lines")};
  if (r.batch_size > 0) args << QStringLiteral("--batch") << QString::number(r.batch_size);
  if (!r.device.isEmpty()) args << QStringLiteral("--device") << r.device;
  if (!r.dtype.isEmpty()) args << QStringLiteral("--dtype") << r.dtype;
  return args;
}

std::optional<RunRequest> run_request(const Profile& profile, const QString& plan_path, int steps,
                                      const QString& trace_path) {
  const auto spec = model_spec_from_meta(profile.meta_json);
  if (!spec) return std::nullopt;
  RunRequest r;
  r.model_spec = *spec;
  r.plan_path = plan_path;
  r.steps = steps;
  r.trace_path = trace_path;
  r.batch_size = profile.batch_size;
  // Only the values the command knows; anything else is left to its defaults.
  if (profile.device.type == "cpu" || profile.device.type == "cuda") {
    r.device = QString::fromStdString(profile.device.type);
  }
  if (profile.dtype == "float32" || profile.dtype == "float64")
    r.dtype = QString::fromStdString(profile.dtype);
  return r;
}

std::optional<RunProgress> parse_progress_line(const QString& line) {
  const QStringList parts = line.trimmed().split(QLatin1Char(' '), Qt::SkipEmptyParts);
  if (parts.size() != 3 || parts[0] != QLatin1String("progress")) return std::nullopt;
  bool done_ok = false, total_ok = false;
  const int done = parts[1].toInt(&done_ok);
  const int total = parts[2].toInt(&total_ok);
  if (!done_ok || !total_ok || done < 0 || total < 0) return std::nullopt;
  return RunProgress{done, total};
}

bool ProgressReader::take_line(const QString& line) {
  const QString trimmed = line.trimmed();
  if (trimmed.isEmpty()) return false;
  last_line_ = trimmed;
  if (auto p = parse_progress_line(trimmed)) {
    const bool changed = p != progress_;
    progress_ = p;
    return changed;
  }
  return false;
}

bool ProgressReader::feed(const QByteArray& chunk) {
  pending_ += chunk;
  bool changed = false;
  for (qsizetype newline; (newline = pending_.indexOf('\n')) >= 0;) {
    changed |= take_line(QString::fromUtf8(pending_.left(newline)));
    pending_.remove(0, newline + 1);
  }
  return changed;
}

bool ProgressReader::finish() {
  const bool changed = take_line(QString::fromUtf8(pending_));
  pending_.clear();
  return changed;
}

QString locate_pipetune_cli(const QString& app_dir, const QString& env_value) {
  auto executable = [](const QString& path) {
    const QFileInfo info(path);
    return info.isFile() && info.isExecutable();
  };
  if (!env_value.isEmpty())
    return executable(env_value) ? QFileInfo(env_value).absoluteFilePath() : QString();
  const QDir dir(app_dir);
  for (const QString& candidate : {dir.filePath(QStringLiteral("../../cli/pipetune")),
                                   dir.filePath(QStringLiteral("pipetune"))}) {
    if (executable(candidate)) return QFileInfo(candidate).canonicalFilePath();
  }
  return QStandardPaths::findExecutable(QStringLiteral("pipetune"));
}

}  // namespace pipetune::gui
