"""The command lines tests start hub-vit's programs with, in a process of their own."""

from __future__ import annotations

import sys

HUB_VIT = [sys.executable, "-c", "from hub_vit.cli import run; run()"]  # the `hub-vit` program, as its script runs it
