"""`hub-vit classify`'s notes below its table: one readable line, whatever the number of images."""

from __future__ import annotations

import io
from types import SimpleNamespace

from rich.console import Console

from hub_vit.server.protocol import IN_DOMAIN, OUT_OF_DOMAIN


def test_the_out_of_domain_note_names_the_first_few_and_counts_the_rest(monkeypatch) -> None:
    # was: every out-of-domain file named on one line (100 photos: 100 names; thousands: one enormous line)
    import hub_vit.cli.classify as classify_cli

    screen = io.StringIO()
    monkeypatch.setattr(classify_cli, "console", Console(file=screen, width=400, color_system=None))
    names = [f"photo{index:03d}.jpg" for index in range(100)]
    verdicts = [OUT_OF_DOMAIN if index % 10 else IN_DOMAIN for index in range(100)]  # 90 outside
    classify_cli._domain_notes(names, [SimpleNamespace(domain=verdict) for verdict in verdicts])
    text = screen.getvalue()
    assert text.startswith("note: 90 images: photo001.jpg, photo002.jpg, photo003.jpg and 87 more: "), text
    assert "photo099" not in text and len(text.splitlines()) == 1, text

    screen.seek(0), screen.truncate()
    classify_cli._domain_notes(names[:2], [SimpleNamespace(domain=OUT_OF_DOMAIN)] * 2)
    assert screen.getvalue().startswith("note: photo000.jpg, photo001.jpg: "), screen.getvalue()
