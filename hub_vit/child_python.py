"""The command line that starts a Python child of hub-vit (the serve build, the front's workers, the CUDA probe).

`python -m X` and `python -c ...` put the working folder first on sys.path: a `hub_vit` folder there (a clone of this
repository beside an installed hub-vit, or any folder of that name) was imported by the child instead of the package
its parent runs, so parent and child spoke different versions, or the child failed to start. `-P` (Python 3.11+,
the oldest hub-vit runs on) leaves the working folder out, as the `hub-vit` script's own start does.
"""

from __future__ import annotations

import sys


def python_command(*args: str) -> list[str]:
    """`[this interpreter, "-P", *args]`."""
    return [sys.executable, "-P", *args]
