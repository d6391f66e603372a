"""Runs timm's own `tests/test_models.py` (downloaded at run time by scripts/peer_suites/run_timm_suite.sh, never kept
in this repository) on the models hub-vit registers with timm, as timm runs it on its own ViTs.

pytest imports this file before it imports test_models.py, so everything here is in place when the test module
builds its parameter lists. This folder is outside the project's `testpaths` (pyproject.toml: `tests`), so the
project's own `make test` never collects it; the runner copies it into a scratch folder beside the test file.

HUB_VIT_MODELS (comma- or space-separated registered names) narrows the run further, e.g.
`HUB_VIT_MODELS=simplevit_digits,vit_ti16`.
"""

from __future__ import annotations

import fnmatch
import os
from collections import Counter
from pathlib import Path

import pytest
import timm
import timm.models
from timm.models import get_pretrained_cfg, model_entrypoint

import hub_vit  # noqa: F401  (registers hub-vit's names with timm)

_timm_list_models = timm.models.list_models

# Every name whose timm entry point is hub-vit's (hub_vit.timm_plugin), asked of timm rather than read from hub-vit's
# catalog, so the run covers exactly what `import hub_vit` registered, the generic `hub_vit` architecture included.
REGISTERED = [n for n in _timm_list_models() if model_entrypoint(n).__module__.split(".")[0] == "hub_vit"]

# Left out by default (HUB_VIT_MODELS can still name them), measured on a 2-core, 23 GiB host (AMD EPYC; torch 2.14.1,
# timm 1.0.31):
# * size: L/16, L/32 and So400m/14 are 304-415 M parameters (1.1-1.5 GiB in float32), H/14 632 M (2.4 GiB), against
#   87 M for B/16. test_model_backward took 8.9 s for vit_s16, 11.3 s for vit_b16 and 19.4 s for vit_l16 (two
#   workers); each name runs in nine tests, plus the config test once per pretrained tag (vit_l16 has five), and the
#   default set alone already takes about 19 minutes on that host. They add time, not a contract the small sizes do
#   not already check.
# * patch 14 (h14, so400m14): timm's test shrinks the input of any model that does not declare a fixed input size to
#   128 pixels (backward, TorchScript, FX) and 96 pixels (features getter, forward_intermediates, pruning). 14-pixel
#   patches tile neither, and hub-vit refuses an input its patches do not tile: test_model_backward on
#   simplevit_so400m14 fails with "image size 128x128 is not divisible by the patch size 14". timm's own patch-14
#   ViTs (vit_huge_patch14_224, vit_so400m_patch14_siglip_224, ...) avoid that by declaring fixed_input_size=True,
#   which keeps them at 224; hub-vit's cfgs do not declare it (its models take any multiple of the patch size).
LARGE = ("_l16", "_l32", "_h14", "_so400m14")
DEFAULT_MODELS = [n for n in REGISTERED if not n.endswith(LARGE)]


def _selected() -> list[str]:
    wanted = os.environ.get("HUB_VIT_MODELS", "").replace(",", " ").split()
    if not wanted:
        return DEFAULT_MODELS
    unknown = sorted(set(wanted) - set(REGISTERED))
    if unknown:
        raise pytest.UsageError(f"HUB_VIT_MODELS names {unknown}, which hub-vit does not register; it registers "
                                f"{', '.join(REGISTERED)}")
    return [n for n in REGISTERED if n in wanted]


SELECTED = frozenset(_selected())

# How timm's test file picks the models a test runs on: fnmatch patterns over model names (NON_STD_FILTERS,
# EXCLUDE_*_FILTERS) and module names (FEAT_INTER_FILTERS: `list_models(module=...)`). Those lists are evaluated
# while test_models.py is imported, in its parametrize decorators, so patching the module's lists from a pytest hook
# after import would come too late, and editing them would mean editing the file that must run verbatim. Instead the
# list_models that the file calls matches each hub-vit name as if it were one of timm's own ViTs: `vit_<name>` for
# the name patterns (NON_STD_FILTERS has 'vit_*': hub-vit's `vit_*` names match it as they are, `simplevit_*` and
# `hub_vit` through the stand-in) and the module `vision_transformer` for the module filters. Whatever timm adds to
# those lists for its ViTs applies to hub-vit's names the same way, with no copy of the lists here.
VIT_MODULE = "vision_transformer"


def _vit_stand_in(name: str) -> str:
    return name if name.startswith("vit_") else f"vit_{name}"


def _as_list(value: str | list[str] | tuple[str, ...] | None) -> list[str]:
    if not value:
        return []
    return [value] if isinstance(value, str) else list(value)


def _matches(name: str, patterns: list[str]) -> bool:
    # the architecture (name without its `.tag`) too: timm's own matching expands a tagless pattern `p` to `p.*`
    arch = name.split(".", 1)[0]
    return any(fnmatch.fnmatch(candidate, p) for candidate in {name, arch, _vit_stand_in(name), _vit_stand_in(arch)}
               for p in patterns)


def list_models(filter="", module="", pretrained=False, exclude_filters="", name_matches_cfg=False,
                include_tags=None):
    """timm.list_models over the selected hub-vit names only. timm itself applies `pretrained`, `name_matches_cfg`
    and the pretrained tags; the name and module filters are applied here, with hub-vit's names matched as timm's
    ViTs (see above)."""
    modules = _as_list(module)
    includes, excludes = _as_list(filter), _as_list(exclude_filters)
    names = []
    for name in _timm_list_models(pretrained=pretrained, name_matches_cfg=name_matches_cfg, include_tags=include_tags):
        if name.split(".", 1)[0] not in SELECTED:
            continue
        if modules and VIT_MODULE not in modules and "timm_plugin" not in modules:
            continue
        if includes and not _matches(name, includes):
            continue
        if excludes and _matches(name, excludes):
            continue
        names.append(name)
    return names


def list_pretrained(filter="", exclude_filters=""):
    """timm.list_pretrained, through the narrowed list_models (timm's own calls its module-level list_models)."""
    return list_models(filter=filter, pretrained=True, exclude_filters=exclude_filters, include_tags=True)


# test_models.py does `from timm import list_models, list_pretrained`; timm.models is patched too for any
# `timm.models.list_models(...)` call. timm's internals keep the real registry (create_model does not list).
for _namespace in (timm, timm.models):
    _namespace.list_models = list_models
    _namespace.list_pretrained = list_pretrained

# Tests left out, by name. Everything else in test_models.py that does not take a hub-vit `model_name` is about one of
# timm's own named models or classes and is left out by the rule in pytest_collection_modifyitems.
NETWORK_TESTS = {
    "test_model_inference": "runs timm's Hub `test_*` checkpoints against reference tensors on the Hub (network)",
}
PRETRAINED_TESTS = ("test_model_load_pretrained", "test_model_features_pretrained")
DESELECTED_LIST = "deselected.txt"


def _weights_need_network(name: str) -> bool:
    """A pretrained tag whose weights are a local file (simplevit_digits ships its model) loads offline; the others
    download Google's checkpoints."""
    cfg = get_pretrained_cfg(name)
    return not (cfg and cfg.file and Path(cfg.file).is_file())


def _deselect_reason(item: pytest.Item) -> str | None:
    test = item.originalname
    if test in NETWORK_TESTS:
        return NETWORK_TESTS[test]
    marker = item.get_closest_marker("skip")
    if marker and str(marker.kwargs.get("reason", "")).startswith("got empty parameter set"):
        return None  # a generic test with no hub-vit name to run on: kept, reported as skipped
    params = item.callspec.params if hasattr(item, "callspec") else {}
    model = params.get("model_name")
    if not isinstance(model, str):
        return "tests one of timm's own classes or helpers (naflexvit, swin, gemma4, attention caches, ...)"
    if model.split(".", 1)[0] not in SELECTED:
        return "tests one of timm's own named models (swin, convnext, regnetx_002, ...)"
    if test in PRETRAINED_TESTS and _weights_need_network(model):
        return "pretrained load whose weights are downloaded (network)"
    return None


def pytest_configure(config: pytest.Config) -> None:
    # the markers timm declares in its own pyproject.toml, which is not here
    for marker in ("base", "cfg", "cfg_nonstd", "forward", "backward", "torchscript", "features", "fxforward",
                   "fxbackward"):
        config.addinivalue_line("markers", f"{marker}: timm's test group")


def pytest_report_header(config: pytest.Config) -> str:
    return f"hub-vit models ({len(SELECTED)}): {', '.join(n for n in REGISTERED if n in SELECTED)}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept, dropped, lines = [], [], []
    for item in items:
        reason = _deselect_reason(item)
        if reason is None:
            kept.append(item)
        else:
            dropped.append(item)
            lines.append(f"{item.nodeid}\t{reason}\n")
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    # pytest-xdist's workers each collect; one writes the list, which the controller summarises at the end
    if os.environ.get("PYTEST_XDIST_WORKER", "gw0") == "gw0":
        (config.rootpath / DESELECTED_LIST).write_text("".join(lines))


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    listed = config.rootpath / DESELECTED_LIST
    if not listed.is_file():
        return
    reasons = Counter(line.split("\t", 1)[1].strip() for line in listed.read_text().splitlines() if "\t" in line)
    if not reasons:  # e.g. -k deselected those items first
        return
    terminalreporter.section("deselected by hub-vit's conftest.py (the list: deselected.txt)")
    for reason, count in reasons.most_common():
        terminalreporter.write_line(f"{count:5d}  {reason}")
