#!/usr/bin/env bash
# Installs everything pipetune builds and tests with, on a fresh Debian machine.
#
# Idempotent: a second run checks what is there and returns in seconds.
#   - Debian packages: only the missing ones are installed (apt-get update runs only then).
#   - LibTorch: the `torch` wheel in a virtual environment kept OUTSIDE the checkout
#     (default ~/.cache/pipetune/venv, override with PIPETUNE_VENV) so fresh clones and
#     CI reuse it instead of downloading gigabytes again.
#
# Environment:
#   PIPETUNE_VENV           where the virtual environment lives
#   PIPETUNE_TORCH_VERSION  the torch wheel to install (default below)
#   PIPETUNE_PYTHON         the interpreter that creates the venv (default python3)
#   PIPETUNE_NO_TORCH=1     skip the venv: builds sim/, cli/ (simulate, plan, sweep), gui/ only
set -euo pipefail

# The GPU image ships torch 2.11.0; the CPU build uses the same version so that a profile, a
# trace or a test result means the same on both.
TORCH_VERSION="${PIPETUNE_TORCH_VERSION:-2.11.0}"
VENV="${PIPETUNE_VENV:-$HOME/.cache/pipetune/venv}"
PYTHON="${PIPETUNE_PYTHON:-python3}"

say() { printf 'setup: %s\n' "$*"; }

packages=(
  cmake ninja-build g++ pkg-config clang-format
  libboost-graph-dev nlohmann-json3-dev libcli11-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  qt6-base-dev qt6-charts-dev xvfb xauth
  libgloo-dev
  python3-venv
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed'; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  say "installing Debian packages: ${missing[*]}"
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { say "need root or sudo to install: ${missing[*]}"; exit 1; }
    sudo_cmd=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  started=$SECONDS
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  say "Debian packages installed in $((SECONDS - started)) s"
else
  say "Debian packages present"
fi

if [ "${PIPETUNE_NO_TORCH:-0}" = 1 ]; then
  say "PIPETUNE_NO_TORCH=1: no LibTorch; the executor and profiler will be left out"
  exit 0
fi

torch_ok() {
  [ -x "$VENV/bin/python" ] &&
    "$VENV/bin/python" - "$TORCH_VERSION" 2>/dev/null <<'PY'
import sys, importlib.metadata as md
md.version("numpy")  # torch.distributed.pipelining, used by bench/, needs it
sys.exit(0 if md.version("torch").split("+")[0] == sys.argv[1] else 1)
PY
}

if torch_ok; then
  say "torch $TORCH_VERSION present in $VENV"
else
  say "installing torch $TORCH_VERSION into $VENV (a few GB, once)"
  mkdir -p "$(dirname "$VENV")"
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  started=$SECONDS
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==$TORCH_VERSION" numpy
  torch_ok || { say "torch $TORCH_VERSION did not install into $VENV"; exit 1; }
  say "torch installed in $((SECONDS - started)) s"
fi
