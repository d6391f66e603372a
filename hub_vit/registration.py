"""Register hub-vit with timm and with the transformers Auto classes, as soon as each library is imported.

`import hub_vit` must make `timm.create_model("simplevit_s16")` and `AutoModel.from_pretrained(<hub-vit folder>)`
work, but importing timm (and so torch) or transformers eagerly would cost every `hub-vit` command several seconds,
including the ones that never touch a model (`hub-vit classify`, `loadtest`, `serve`). So registration is a
post-import hook (wrapt's): it runs at once if the library is already imported, otherwise the moment it is.
"""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType

import wrapt

_installed = False


def _register_timm(_timm: ModuleType) -> None:
    # Side effect of the import: every catalog name becomes a timm entry point. If hub_vit.timm_plugin is the module
    # that is importing timm right now, this returns the half-built module and its own import finishes the job.
    importlib.import_module("hub_vit.timm_plugin")


def _register_transformers(_transformers: ModuleType) -> None:
    try:  # transformers is a core dependency, but a broken install must not break `import transformers` elsewhere
        importlib.import_module("hub_vit.hf")  # side effect: AutoConfig / AutoModel / AutoImageProcessor registration
    except ImportError as exc:  # pragma: no cover - only hit with a broken transformers install
        warnings.warn(f"hub_vit: transformers front door unavailable ({exc})", stacklevel=2)


def install() -> None:
    """Idempotent: called by `hub_vit/__init__`."""
    global _installed
    if not _installed:
        _installed = True
        wrapt.register_post_import_hook(_register_timm, "timm")
        wrapt.register_post_import_hook(_register_transformers, "transformers")
