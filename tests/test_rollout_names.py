"""`hub-vit rollout` output names when several images share a stem: a counter per name, not the argument position."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from hub_vit.cli.explain import output_stems


@pytest.mark.parametrize(("args", "expected"), [
    (["a.png", "b.png"], ["a", "b"]),
    # the reviewer's command: photo2.jpg photo2.png c1/x.png c2/x.png used to give photo2-3 and x-1
    (["photo2.jpg", "photo2.png", "c1/x.png", "c2/x.png"], ["photo2", "photo2-2", "x", "x-2"]),
    (["a/x.png", "b/x.png", "c/x.jpg", "y.png", "d/x.webp"], ["x", "x-2", "x-3", "y", "x-4"]),
    (["a/x.png", "b/x.png", "x-2.png"], ["x", "x-3", "x-2"]),  # a counter never takes another image's own name
    (["Photo.png", "photo.png"], ["Photo", "photo-2"]),  # one file on a case-insensitive file system otherwise
])
def test_output_stems_count_per_name(args: list[str], expected: list[str]) -> None:
    assert output_stems([Path(a) for a in args]) == expected


def test_cli_writes_one_file_per_image_with_counted_names(tmp_path: Path) -> None:
    import hub_vit.cli.explain  # noqa: F401  (registers rollout)
    from hub_vit import VisionTransformer, ViTSpec
    from hub_vit.cli.app import app
    from hub_vit.folder import save_model_folder

    torch.manual_seed(0)
    spec = ViTSpec.from_variant("mu/16", img_size=32, num_classes=2, depth=1, head_zeroinit=False)
    folder = save_model_folder(VisionTransformer(spec), tmp_path / "tiny", labels=["a", "b"])
    rng = np.random.default_rng(0)
    images = [tmp_path / "photo2.jpg", tmp_path / "photo2.png", tmp_path / "c1" / "x.png", tmp_path / "c2" / "x.png"]
    for path in images:
        path.parent.mkdir(exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(path)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["rollout", *map(str, images), "-o", str(out), "--model", str(folder)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["photo2-2_rollout.png", "photo2_rollout.png", "x-2_rollout.png",
                                                     "x_rollout.png"]
