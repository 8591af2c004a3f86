#!/usr/bin/env bash
# Packs what a GPU machine's image lacks for a pipetune build without Qt: the Debian packages'
# headers, libraries and CMake files (Boost headers, nlohmann-json, CLI11, fmt, GoogleTest and
# GoogleMock, Google Benchmark, gloo headers), taken from this machine's installed packages.
# The GPU machine has its own torch, CUDA toolkit, CMake, ninja and compiler; it cannot fetch
# anything, so the kit travels with the tree and scripts/gpu-check.sh unpacks it.
#
#   scripts/gpu-kit.sh [DIR]          (default .gpu-kit, git-ignored)
#   scripts/gpu-kit.sh --prove [DIR]  then build against the kit alone, as the GPU machine will
#
# --prove (root, Linux) hides this machine's copies of the kit's packages in a private mount
# namespace (empty folders over their headers and CMake files, /dev/null over their libraries)
# and runs `scripts/gpu-check.sh kit build` there with this machine's torch, so a header or
# library the kit lacks fails here, not on the GPU machine.
#
# Writes DIR/kit.tar.xz (the files under their /usr paths, so each package's CMake config still
# finds its headers relative to itself) and DIR/MANIFEST (package versions, sizes). Idempotent:
# a kit that matches the installed package versions is left as it is.
set -euo pipefail
cd "$(dirname "$0")/.."

prove=0
if [ "${1:-}" = --prove ]; then
  prove=1
  shift
fi
dir="${1:-.gpu-kit}"
say() { printf 'gpu-kit: %s\n' "$*"; }

# -dev packages and the runtime libraries their CMake configs point at.
packages=(
  libboost1.74-dev
  nlohmann-json3-dev
  libcli11-dev
  libfmt-dev libfmt9
  libgtest-dev libgmock-dev
  libbenchmark-dev libbenchmark1debian
  libgloo-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  say "not installed here: ${missing[*]} (run scripts/setup.sh first)"
  exit 1
fi

manifest="$(for p in "${packages[@]}"; do dpkg-query -W -f='${Package} ${Version}\n' "$p"; done)"

# Inside the private namespace: hide the packages, then build against the kit.
if [ "${PIPETUNE_KIT_HIDDEN:-0}" = 1 ]; then
  for p in "${packages[@]}"; do dpkg -L "$p"; done | grep -E '^/usr/(include|lib|share/cmake)/' |
    while read -r f; do
      if [ -d "$f" ] && [ ! -L "$f" ]; then
        # A folder only the kit's packages fill: /usr/include/boost, a CMake config folder.
        case "$f" in
          /usr/include/* | /usr/lib/*/cmake/* | /usr/share/cmake/*)
            [ "$(dirname "$f")" = /usr/include ] || [[ "$f" == */cmake/* ]] || continue
            mount -t tmpfs none "$f" ;;
        esac
      elif [ -f "$f" ] && [ ! -L "$f" ] && [[ "$f" == /usr/include/* || "$f" == /usr/lib/* ]]; then
        mountpoint -q "$(dirname "$f")" || mount --bind /dev/null "$f" 2>/dev/null || true
      fi
    done
  [ ! -e /usr/include/boost/graph/adjacency_list.hpp ] && [ ! -s /usr/include/fmt/format.h ] ||
    { say "could not hide the system's copies"; exit 1; }
  say "system copies hidden; building against the kit"
  export PIPETUNE_GPU_WORK="${PIPETUNE_GPU_WORK:-/tmp/pipetune-kit-proof}"
  export PIPETUNE_PYTHON="${PIPETUNE_PYTHON:-${PIPETUNE_VENV:-$HOME/.cache/pipetune/venv}/bin/python}"
  PIPETUNE_KIT="$(realpath "$dir/kit.tar.xz")"
  export PIPETUNE_KIT
  exec scripts/gpu-check.sh kit build
fi

if [ -f "$dir/kit.tar.xz" ] && [ -f "$dir/MANIFEST" ] &&
   [ "$(sed -n '/^# packages$/,/^# files$/p' "$dir/MANIFEST" | sed '1d;$d')" = "$manifest" ]; then
  say "$dir/kit.tar.xz is up to date ($(du -h "$dir/kit.tar.xz" | cut -f1))"
  if [ "$prove" = 1 ]; then exec unshare --mount --propagation private env PIPETUNE_KIT_HIDDEN=1 "$0" "$dir"; fi
  exit 0
fi

mkdir -p "$dir"
list="$(mktemp)"
trap 'rm -f "$list" "$dir/kit.tar.xz.partial"' EXIT
# Headers, libraries, CMake and pkg-config files; no documentation, no man pages, no Python.
for p in "${packages[@]}"; do dpkg -L "$p"; done |
  grep -E '^/usr/(include|lib|share/cmake|share/pkgconfig)/' |
  grep -vE '^/usr/lib/python|libgloo' |
  while read -r f; do
    # Directories come along with the files in them; a dangling link would break tar.
    if [ -f "$f" ] || [ -L "$f" ]; then printf '%s\n' "${f#/}"; fi
  done | sort -u > "$list"

say "packing $(wc -l < "$list") files from ${#packages[@]} packages"
tar -C / -cf - --files-from "$list" | xz -T0 -6 > "$dir/kit.tar.xz.partial"
mv "$dir/kit.tar.xz.partial" "$dir/kit.tar.xz"
{
  echo "# pipetune GPU kit, made $(date -u +%F) on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "# packages"
  echo "$manifest"
  echo "# files"
  wc -l < "$list"
} > "$dir/MANIFEST"
say "wrote $dir/kit.tar.xz ($(du -h "$dir/kit.tar.xz" | cut -f1)); unpack with scripts/gpu-check.sh kit"
if [ "$prove" = 1 ]; then exec unshare --mount --propagation private env PIPETUNE_KIT_HIDDEN=1 "$0" "$dir"; fi
