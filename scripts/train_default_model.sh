#!/usr/bin/env bash
# Reproduce the shipped default model (hub_vit/assets/digits) from scratch on CPU.
#
#   scripts/train_default_model.sh [RUN_DIR] [INSTALL_DIR]
#
# Trains simplevit_digits with `hub-vit train --preset digits` (the paper's recipe scaled down, see docs/training.md)
# on scikit-learn's digits, then copies the finished model folder with sample images and a card stub to INSTALL_DIR
# (default: runs/digits-installed). Both paths are relative to the repository root (the script cd's there first), so
# `scripts/train_default_model.sh runs/digits hub_vit/assets/digits` overwrites the shipped model in place.
# The samples are the first held-out digits the model classifies correctly: a short or untrained run installs
# samples only for the classes it gets right. Re-running with the same RUN_DIR resumes from its newest checkpoint.
# One process, one torch thread, one data-loading worker.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN_DIR="${1:-runs/digits}"
INSTALL_DIR="${2:-runs/digits-installed}"
PY="${PYTHON:-.venv/bin/python}"
export OMP_NUM_THREADS=1
time nice -n 5 "$PY" -m hub_vit.train --preset digits --out "$RUN_DIR" --threads 1 --install-to "$INSTALL_DIR"
