#!/usr/bin/env bash
# Run timm's own generic model tests (tests/test_models.py of the installed timm) on the models hub-vit registers.
#
#   scripts/peer_suites/run_timm_suite.sh [SCRATCH] [PYTEST_ARGS...]
#   scripts/peer_suites/run_timm_suite.sh /tmp/timm_suite -n 2
#   HUB_VIT_MODELS=simplevit_digits,vit_ti16 scripts/peer_suites/run_timm_suite.sh /tmp/timm_suite -x
#
# SCRATCH (default: a new mktemp folder) receives the sdist of the installed timm version, its tests/test_models.py
# (only that file: timm's test code is not kept in this repository, and the sdist's tests/conftest.py is not needed)
# and a copy of scripts/peer_suites/timm/conftest.py, which narrows timm's model lists to hub-vit's names. A first
# argument that starts with "-" is a pytest argument, not SCRATCH. PYTHON (default: the repository's .venv/bin/python)
# is the environment with hub-vit, timm, pytest, pytest-timeout and (for -n) pytest-xdist installed.
# HUB_VIT_MODELS narrows the models (see the conftest for the default and why the large sizes are left out).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
PY="${PYTHON:-$REPO/.venv/bin/python}"
case "$PY" in /*) ;; */*) PY="$PWD/$PY" ;; esac  # a relative path is the caller's; the tests run in SCRATCH
if [[ $# -gt 0 && "$1" != -* ]]; then
  SCRATCH="$1"
  shift
else
  SCRATCH="$(mktemp -d -t timm_suite.XXXXXX)"
fi
mkdir -p "$SCRATCH"
SCRATCH="$(cd "$SCRATCH" && pwd)"

TIMM_VERSION="$("$PY" -c 'import timm; print(timm.__version__)')" || {
  echo "run_timm_suite: $PY cannot import timm (set PYTHON to the environment that has hub-vit installed)" >&2
  exit 2
}
SDIST="$SCRATCH/timm-$TIMM_VERSION.tar.gz"
if [[ ! -f "$SDIST" ]]; then  # kept in SCRATCH: a rerun there works offline
  echo "downloading the sdist of timm $TIMM_VERSION (the version $PY imports) into $SCRATCH"
  # short timeout and no retries: without PyPI this fails in seconds instead of pip's minutes of retrying
  if ! "$PY" -m pip download --quiet --no-binary :all: --no-deps --timeout 15 --retries 0 \
      -d "$SCRATCH" "timm==$TIMM_VERSION"; then
    echo "run_timm_suite: could not download timm==$TIMM_VERSION's sdist from PyPI (no network, or a" \
      "version PyPI has no sdist for). Put timm-$TIMM_VERSION.tar.gz in $SCRATCH by hand and rerun." >&2
    exit 2
  fi
fi
# only the one test file, at the top of SCRATCH where the conftest sits
tar -xzf "$SDIST" -C "$SCRATCH" --strip-components=2 "timm-$TIMM_VERSION/tests/test_models.py"
cp "$REPO/scripts/peer_suites/timm/conftest.py" "$SCRATCH/conftest.py"
# SCRATCH's own ini makes it pytest's rootdir, so no pytest configuration above it (the repository's pyproject.toml
# when SCRATCH is inside the clone) applies
printf '[pytest]\naddopts = -ra\n' > "$SCRATCH/pytest.ini"  # -ra: each skip with its reason

cd "$SCRATCH"
echo "timm $TIMM_VERSION's test_models.py in $SCRATCH; $PY -m pytest test_models.py -q $*"
start=$SECONDS
set +e
"$PY" -m pytest test_models.py -q "$@"
rc=$?
set -e
echo "wall time: $((SECONDS - start)) s"
exit $rc
