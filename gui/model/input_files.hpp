#pragma once

// Telling the files given on the command line (or dropped in a dialog) apart by their format
// tag, so `pipetune-gui a.json b.json` works in any order.

#include <QString>

namespace pipetune::gui {

enum class FileKind { Profile, Hardware, Plan, Trace, Unknown };

/// The kind by the first format tag in the file; Unknown (and `error` set) when the file cannot
/// be read or has no known tag.
FileKind classify_file(const QString& path, QString* error);

}  // namespace pipetune::gui
