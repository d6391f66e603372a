"""The shared typer application and rich console."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape

app = typer.Typer(
    name="hub-vit",
    help="Google's Vision Transformers for timm, transformers, ONNX and Triton.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print a red error line and return the Exit to raise: `raise fail("...")`."""
    # escaped: paths may hold [brackets]; soft-wrapped: a command or path in the message stays pasteable
    # emoji=False: '127.0.0.1:-1' must not turn into a thumbs-down
    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True, emoji=False)
    return typer.Exit(code)


@app.callback()
def _root() -> None:
    """Google's Vision Transformers for timm, transformers, ONNX and Triton."""
