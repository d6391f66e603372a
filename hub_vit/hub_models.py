"""A hub-vit model folder on the Hugging Face Hub, named `hf-hub:ORG/NAME[@REVISION]` as timm names it, fetched into
huggingface_hub's own cache (HF_HUB_CACHE, shared with timm and transformers) and used from there as a local folder.

    >>> from hub_vit.hub_models import hub_folder
    >>> hub_folder("hf-hub:my-org/tiny-vit")      # -> ~/.cache/huggingface/hub/models--my-org--tiny-vit/snapshots/<sha>

The repository's config.json is read first, alone: a repository that is not a hub-vit model (a transformers ViT, a
timm checkpoint) is refused by what it is before its weights are downloaded. Then the files a model folder uses are
fetched (weights, configs, labels, card, remote code, the out-of-domain score; exported graphs are not).

The network is asked only when it can answer: with an offline switch on, or no connection to the Hub within a few
seconds (`hub_vit.network.check_reachable`), the cached snapshot is used at once with a warning; not cached,
`HubUnreachableError` says both. Every refusal names the reference as the user gave it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from hub_vit.network import HubUnreachableError, check_reachable, hub_endpoint
from hub_vit.repo_id import check_repo_id
from hub_vit.variants import MODEL_TYPE

PREFIX = "hf-hub:"  # timm's prefix for a Hub repository (`timm.create_model("hf-hub:ORG/NAME")`)
# What a model folder holds and hub-vit reads, at its top level: weights, config.json and the processor's, labels.txt,
# the card, the transformers remote code, domain.json / domain.safetensors. Not fetched: exported graphs, other weight
# formats, and subfolders (a classic ViT's `native/` is a second copy of the weights, for transformers' own ViT class).
FOLDER_FILES = ("*.safetensors", "*.json", "*.txt", "*.md", "*.py")
NOT_FETCHED = ("*/*",)  # huggingface_hub matches patterns with fnmatch, whose `*` also matches `/`
logger = logging.getLogger(__name__)


def is_hub_reference(reference: str) -> bool:
    """Whether `reference` names a Hub repository (`hf-hub:...`)."""
    return reference.startswith(PREFIX)


def parse_reference(reference: str) -> tuple[str, str | None]:
    """`hf-hub:ORG/NAME[@REVISION]` -> (ORG/NAME, REVISION or None); ValueError naming the reference otherwise."""
    if not is_hub_reference(reference):
        raise ValueError(f"{reference!r} is not a Hub reference: expected {PREFIX}ORG/NAME[@REVISION]")
    repo_id, at, revision = reference[len(PREFIX):].partition("@")
    if at and not revision:
        raise ValueError(f"{reference!r} names no revision after '@': give a branch, tag or commit, or drop the '@'")
    try:
        check_repo_id(repo_id)
    except ValueError as exc:
        raise ValueError(f"{reference!r}: {exc}") from None
    return repo_id, revision or None


def repo_name(reference: str) -> str:
    """NAME of `hf-hub:ORG/NAME[@REVISION]`: what the model is called in reports."""
    return parse_reference(reference)[0].partition("/")[2]


def hub_folder(reference: str, *, download: bool = True) -> Path:
    """The local folder (a snapshot in huggingface_hub's cache) of the hub-vit model `reference` names, fetched when
    not cached and the Hub can be reached; `download=False` never goes to the network. Raises ValueError for a bad
    reference, a repository or revision the Hub does not have, or one that is not a hub-vit model;
    `HubUnreachableError` when the Hub cannot be reached (or may not be asked) and the cache does not hold it."""
    repo_id, revision = parse_reference(reference)
    unreachable: HubUnreachableError | None = None
    if download:
        try:
            check_reachable(hub_endpoint())  # an offline switch on counts as unreachable
        except HubUnreachableError as exc:
            unreachable = exc
    local_only = unreachable is not None or not download
    try:
        folder = _fetch(repo_id, revision, reference, local_only)
    except _NotCached as missing:
        from huggingface_hub import constants

        why = (f"{unreachable}, and" if unreachable is not None
               else "hub-vit does not download here (download=False), and")
        held = "holds only part of it (an interrupted download?)" if missing.partial else "does not hold it"
        raise HubUnreachableError(f"cannot load {reference!r}: {why} huggingface_hub's cache "
                                  f"({constants.HF_HUB_CACHE}) {held}; run the command once where the Hub can be "
                                  "reached (it is cached from then on), or set HF_HUB_CACHE to a cache that has it"
                                  ) from None
    if unreachable is not None:
        logger.warning(f"{unreachable}: using {reference!r} from huggingface_hub's cache ({folder})")
    return folder


class _NotCached(Exception):
    """The cache does not hold what was asked for (`partial`: some of its files), and the Hub was not asked."""

    def __init__(self, partial: bool) -> None:
        super().__init__()
        self.partial = partial


def _fetch(repo_id: str, revision: str | None, reference: str, local_only: bool) -> Path:
    """config.json alone (checked to be a hub-vit model's), then the folder's files, as one snapshot."""
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    endpoint = hub_endpoint()  # HF_ENDPOINT as it is now, as the reachability check read it
    where = f"the Hugging Face Hub ({endpoint})"
    try:
        config = Path(hf_hub_download(repo_id, "config.json", revision=revision, local_files_only=local_only,
                                      endpoint=endpoint))
        _check_model_type(config, reference)
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=list(FOLDER_FILES),
                                      ignore_patterns=list(NOT_FETCHED), local_files_only=local_only,
                                      endpoint=endpoint))
    except LocalEntryNotFoundError as exc:
        if local_only:
            raise _NotCached(partial=isinstance(exc, IncompleteSnapshotError)) from None
        raise HubUnreachableError(f"cannot load {reference!r}: the connection to {where} failed during the download "
                                  f"({str(exc).splitlines()[0]}); try again") from None
    except GatedRepoError:  # before RepositoryNotFoundError: it is one
        raise ValueError(f"{reference!r} is a gated repository on {where}: accept its conditions on its page, then "
                         "log in (`hf auth login`, or HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise ValueError(f"{reference!r}: {repo_id} has no revision {revision!r} on {where} (a branch, tag or "
                         "commit)") from None
    except RepositoryNotFoundError:
        raise ValueError(f"{reference!r}: no model repository {repo_id!r} on {where}; a private one needs a token "
                         "(`hf auth login`, or HF_TOKEN)") from None
    except EntryNotFoundError:
        raise ValueError(f"{reference!r} has no config.json, so it is not a hub-vit model folder (`hub-vit push` "
                         "uploads a model folder with its config.json, model.safetensors and labels)") from None
    except HfHubHTTPError as exc:
        raise HubUnreachableError(f"cannot load {reference!r}: {where} answered {str(exc).splitlines()[0]}") from None


def _check_model_type(config: Path, reference: str) -> None:
    """Refuse, by what it is, a repository whose config.json is not a hub-vit model's (before its weights come)."""
    try:
        raw = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ValueError(f"{reference!r}: its config.json is not readable JSON ({exc})") from None
    model_type = raw.get("model_type") if isinstance(raw, dict) else None
    if model_type == MODEL_TYPE:
        return
    if model_type is not None:
        what = f"a transformers {model_type!r} model"
    elif isinstance(raw, dict) and "architecture" in raw:
        what = f"a timm {raw['architecture']!r} model (load it with timm.create_model({reference!r}))"
    else:
        what = "not a model folder hub-vit knows"
    raise ValueError(f"{reference!r} is {what}, not a hub-vit model (config.json's model_type is {model_type!r}, "
                     f"expected {MODEL_TYPE!r}): hub-vit takes the model folders `hub-vit push` uploads")
