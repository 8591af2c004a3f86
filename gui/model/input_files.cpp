#include "gui/model/input_files.hpp"

#include <QFile>
#include <array>
#include <utility>

namespace pipetune::gui {

FileKind classify_file(const QString& path, QString* error) {
  QFile file(path);
  if (!file.open(QIODevice::ReadOnly)) {
    if (error) *error = QStringLiteral("%1: cannot read it (%2)").arg(path, file.errorString());
    return FileKind::Unknown;
  }
  // Tags come first in every writer's output, and a trace's own tag before the plan inside it;
  // the earliest tag in the head of the file decides.
  const QByteArray head = file.read(64 * 1024);
  static const std::array<std::pair<const char*, FileKind>, 4> kTags = {{
      {"\"pipetune.profile/1\"", FileKind::Profile},
      {"\"pipetune.hardware/1\"", FileKind::Hardware},
      {"\"pipetune.plan/1\"", FileKind::Plan},
      {"\"pipetune.trace/1\"", FileKind::Trace},
  }};
  FileKind kind = FileKind::Unknown;
  qsizetype earliest = -1;
  for (const auto& [tag, k] : kTags) {
    const qsizetype at = head.indexOf(tag);
    if (at >= 0 && (earliest < 0 || at < earliest)) earliest = at, kind = k;
  }
  if (kind == FileKind::Unknown && error) {
    *error =
        QStringLiteral("%1: not a pipetune profile, hardware, plan or trace file (no format tag)")
            .arg(path);
  }
  return kind;
}

}  // namespace pipetune::gui
