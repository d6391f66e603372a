"""Publish a hub-vit model folder to the Hugging Face Hub: validate, check the Hub is reachable, one commit.

    >>> from hub_vit.publish import push_folder
    >>> push_folder("out/simplevit_s16", "my-org/simplevit-s16")   # -> "https://huggingface.co/my-org/simplevit-s16"

Nothing is sent unless every check passes: the folder is complete (weights, config, preprocessor, labels, card, the
transformers remote code its `auto_map` names), the card parses, offline mode is off and the Hub answers a TCP
connect within `timeout` seconds. The upload is a single commit, so a failure half-way leaves the repository as it
was. A hub-vit generated card is re-rendered with the repo id so its snippets say `hf-hub:ORG/NAME`; the local
folder is never modified.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path

from hub_vit.model_cards.facts import (
    CARD,
    CONFIG,
    LABELS,
    PREPROCESSOR,
    WEIGHTS,
    ModelFolderError,
    read_folder,
    read_json,
    read_spec,
)
from hub_vit.network import CONNECT_TIMEOUT_S, HubUnreachableError, check_reachable, hub_endpoint
from hub_vit.repo_id import check_repo_id

REQUIRED_FILES = (WEIGHTS, CONFIG, PREPROCESSOR, LABELS, CARD)
TIMM_KEYS = ("architecture", "pretrained_cfg", "model_args")  # timm's hf-hub loader reads these from config.json
# Never uploaded: editor/OS litter, bytecode, half-written temp files of our own atomic writers.
IGNORED = re.compile(r"(^|/)(\.[^/]*|__pycache__)(/|$)|\.pyc$|\.tmp$")


@dataclass(frozen=True)
class PushPlan:
    """What `push_folder` will upload: files relative to the folder, and the card text that goes up as README.md."""

    folder: Path
    files: tuple[str, ...]
    card_text: str


def required_files(folder: Path) -> tuple[str, ...]:
    """`REQUIRED_FILES`, without `labels.txt` for a headless model (`num_classes` 0 in config.json, e.g. a SigLIP
    image tower): it has no classes to name, and `hub-vit convert` writes no labels file for it."""
    if (folder / CONFIG).is_file():
        with contextlib.suppress(ModelFolderError):  # an unreadable config.json is reported by read_folder
            if read_spec(read_json(folder / CONFIG), folder / CONFIG).num_classes == 0:
                return tuple(name for name in REQUIRED_FILES if name != LABELS)
    return REQUIRED_FILES


def missing_files(folder: Path, required: tuple[str, ...]) -> list[str]:
    """What keeps `required` from being files in `folder`: `missing labels.txt, README.md`, and a directory under a
    file's name named as one (`labels.txt is a directory`: "missing" next to a labels.txt reads as a bug)."""
    absent = [name for name in required if not (folder / name).exists()]
    other = [f"{name} is {'a directory' if (folder / name).is_dir() else 'not a regular file'}" for name in required
             if (folder / name).exists() and not (folder / name).is_file()]
    return ([f"missing {', '.join(absent)}"] if absent else []) + other


def validate_folder(folder: str | Path, repo_id: str | None = None) -> PushPlan:
    """Check `folder` is a complete hub-vit model folder with a parsable card; returns what would be uploaded."""
    from hub_vit.folder import not_a_folder  # here: the folder module imports torch, checking a push needs none
    from hub_vit.model_cards.render import is_generated_card, parse_card, render_model_card

    folder = Path(folder)
    problem = not_a_folder(folder)
    if problem is not None:
        raise ModelFolderError(str(problem))
    required = required_files(folder)
    problems = missing_files(folder, required)
    if problems:
        hint = f"; write the card with `hub-vit card {folder}`" if problems == [f"missing {CARD}"] else ""
        raise ModelFolderError(f"refusing to push {folder}: {'; '.join(problems)} (a hub-vit model folder needs the "
                               f"files {', '.join(required)}){hint}")
    facts = read_folder(folder)  # spec, labels and weights agree with each other
    absent = [k for k in TIMM_KEYS if k not in facts.config]
    if absent:
        raise ModelFolderError(f"refusing to push {folder}: {CONFIG} lacks {', '.join(absent)}, which timm's "
                               "`hf-hub:` loader needs")
    if not facts.has_remote_code:
        raise ModelFolderError(f"refusing to push {folder}: {CONFIG} has no `auto_map`, or a module it names is "
                               "missing, so transformers' trust_remote_code=True could not load the model")
    card_text = (folder / CARD).read_text(encoding="utf-8")
    try:
        card = parse_card(card_text)
    except Exception as exc:  # huggingface_hub raises ValueError / yaml errors for a broken header
        raise ModelFolderError(f"refusing to push {folder}: {CARD} does not parse as a model card: {exc}") from exc
    if not card.data.to_dict():
        raise ModelFolderError(f"refusing to push {folder}: {CARD} has no YAML metadata; regenerate it with "
                               f"`hub-vit card {folder}`")
    if repo_id is not None and is_generated_card(card_text):
        card_text = str(render_model_card(folder, repo_id=repo_id))
    files = sorted(
        p.relative_to(folder).as_posix() for p in folder.rglob("*")
        if p.is_file() and not IGNORED.search(p.relative_to(folder).as_posix())
    )
    return PushPlan(folder=folder, files=tuple(files), card_text=card_text)


def push_folder(folder: str | Path, repo_id: str, *, private: bool = False, token: str | None = None,
                endpoint: str | None = None, timeout: float = CONNECT_TIMEOUT_S,
                commit_message: str | None = None) -> str:
    """Upload `folder` to the model repository `repo_id` (created if needed) in one commit; returns its URL."""
    from huggingface_hub import CommitOperationAdd, HfApi, get_token

    check_repo_id(repo_id)
    if not (isinstance(timeout, (int, float)) and 0 < timeout <= 600):
        raise ValueError(f"timeout must be a number of seconds in (0, 600], got {timeout!r}")
    plan = validate_folder(folder, repo_id=repo_id)
    endpoint = hub_endpoint(endpoint)
    check_reachable(endpoint, timeout)
    token = token or get_token()
    if not token:
        raise PermissionError("no Hugging Face token: pass --token, set HF_TOKEN, or run `hf auth login`")
    api = HfApi(endpoint=endpoint, token=token)
    repo_url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    operations = [
        CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(plan.folder / name))
        for name in plan.files if name != CARD
    ]
    operations.append(CommitOperationAdd(path_in_repo=CARD, path_or_fileobj=plan.card_text.encode("utf-8")))
    from hub_vit.version import __version__

    api.create_commit(repo_id, operations, repo_type="model",
                      commit_message=commit_message or f"Upload hub-vit model folder (hub-vit {__version__})")
    return str(repo_url)


__all__ = ["HubUnreachableError", "PushPlan", "check_reachable", "check_repo_id", "push_folder", "validate_folder"]
