"""`hub-vit card FOLDER` (write the model card) and `hub-vit push FOLDER --repo-id ORG/NAME` (publish the folder)."""

from __future__ import annotations

from pathlib import Path

import typer

from hub_vit.cli.app import CANNOT_NOW, app, console, fail, write_failed
from hub_vit.cli.path_option import local_model_folder


@app.command()
def card(
    folder: Path = typer.Argument(..., help="A hub-vit model folder (config.json + model.safetensors).",
                                  parser=local_model_folder),
    repo_id: str = typer.Option(None, "--repo-id", help="Write the usage snippets for this Hub repo (ORG/NAME)."),
    stdout: bool = typer.Option(False, "--stdout", help="Print the card instead of writing README.md."),
) -> None:
    """(Re)write FOLDER/README.md: the model card, rendered from the folder's own JSON."""
    from hub_vit.model_cards import ModelFolderError, render_model_card
    from hub_vit.model_cards.render import card_path, write_text_atomic
    from hub_vit.publish import check_repo_id

    try:
        if repo_id is not None:
            check_repo_id(repo_id)
        path = None if stdout else card_path(folder)  # a directory named README.md: refused before the render
        text = str(render_model_card(folder, repo_id=repo_id))
    except (ModelFolderError, ValueError) as exc:
        raise fail(str(exc)) from None
    if path is None:
        print(text, end="")
        return
    try:
        write_text_atomic(path, text)
    except OSError as exc:  # read-only or full file system: written atomically, so the old README.md stays intact
        raise write_failed(path, exc) from None
    # soft-wrapped: a script reading `wrote (.*)` from a pipe (80 columns) must get the whole path on one line
    console.print(f"wrote {path}", markup=False, soft_wrap=True)


@app.command()
def push(
    folder: Path = typer.Argument(..., help="A hub-vit model folder with its card (see `hub-vit card`).",
                                  parser=local_model_folder),
    repo_id: str = typer.Option(..., "--repo-id", help="Hub model repository to create or update: ORG/NAME."),
    private: bool = typer.Option(False, "--private", help="Create the repository as private."),
    token: str = typer.Option(None, "--token", help="Hub token (default: HF_TOKEN or the `hf auth login` token).",
                              show_default=False),
    timeout: float = typer.Option(3.0, "--timeout", help="Seconds to wait for the Hub to answer before giving up."),
) -> None:
    """Upload FOLDER to the Hugging Face Hub in one commit and print the repository URL."""
    from hub_vit.model_cards import ModelFolderError
    from hub_vit.publish import HubUnreachableError, push_folder

    try:
        url = push_folder(folder, repo_id, private=private, token=token, timeout=timeout)
    except HubUnreachableError as exc:
        raise fail(f"{exc}. Nothing was uploaded.", code=CANNOT_NOW) from None
    except (ModelFolderError, ValueError, PermissionError) as exc:
        raise fail(f"{exc}. Nothing was uploaded.") from None
    except Exception as exc:  # HTTP errors from the Hub (auth, permissions, quota): report, don't dump a traceback
        raise fail(f"the Hub refused the upload: {type(exc).__name__}: {exc}", code=1) from None
    console.print(f"pushed {folder} to {url}", markup=False)
    console.print(f"serve it: hub-vit serve hf-hub:{repo_id}", markup=False)  # any command taking a model folder
