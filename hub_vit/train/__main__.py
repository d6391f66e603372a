"""`python -m hub_vit.train ARGS` == `hub-vit train ARGS`; the entry point for `torchrun -m hub_vit.train`."""

from __future__ import annotations

import sys

from hub_vit.cli import _load_commands, app

if __name__ == "__main__":
    _load_commands()
    app(args=["train", *sys.argv[1:]], prog_name="hub-vit")
