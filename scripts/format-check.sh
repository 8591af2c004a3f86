#!/usr/bin/env bash
# Fails, naming the files, where a tracked C++ file differs from what clang-format (the
# repository's .clang-format) makes of it. Fix with:
#   git ls-files '*.cpp' '*.hpp' '*.h' '*.cu' | xargs clang-format -i
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "format-check: clang-format is not installed (scripts/setup.sh installs it)" >&2; exit 1; }
unformatted=()
while IFS= read -r file; do
  clang-format --dry-run -Werror "$file" >/dev/null 2>&1 || unformatted+=("$file")
done < <(git ls-files '*.cpp' '*.hpp' '*.h' '*.cu')
if ((${#unformatted[@]})); then
  printf 'format-check: not as clang-format (%s) makes them:\n' "$(clang-format --version | sed 's/.*version //')" >&2
  printf '  %s\n' "${unformatted[@]}" >&2
  exit 1
fi
echo "format-check: every C++ file as clang-format makes it"
