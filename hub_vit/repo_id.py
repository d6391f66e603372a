"""A Hugging Face Hub repository's name, ORG/NAME: its shape and the Hub's rule, checked before any network call.

A leaf: the model folder, the cards and the Hub's front door (`hub_models`, `publish`) all name repositories.
"""

from __future__ import annotations

import re

REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$", re.ASCII)  # the shape; the Hub's validator has the finer rules
REPO_ID_RULE = ("expected ORG/NAME, e.g. 'my-org/simplevit-s16' (letters, digits, '-', '_', '.'; no '--' or '..'; not "
                "starting or ending with '-' or '.'; at most 96 characters)")


def check_repo_id(repo_id: str) -> str:
    """ORG/NAME by the Hub's own rule (`huggingface_hub.utils.validate_repo_id`), checked before any network call;
    the namespace is required: hub-vit's models live under a user or organisation."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not isinstance(repo_id, str) or not REPO_ID.match(repo_id):
        raise ValueError(f"invalid repo id {repo_id!r}: {REPO_ID_RULE}")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise ValueError(f"invalid repo id {repo_id!r}: {REPO_ID_RULE} ({str(exc).splitlines()[0]})") from None
    return repo_id


__all__ = ["REPO_ID", "REPO_ID_RULE", "check_repo_id"]
