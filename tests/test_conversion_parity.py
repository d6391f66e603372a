"""Every JAX fixture converts and reproduces Google's own outputs, through timm and through transformers.

Golden values: `tests/fixtures/jax/*/<name>.io.npz`, written by vit_jax / big_vision running their own code (see the
fixtures' README). Tolerance 1e-5 in float32 on CPU: it catches an erf-vs-tanh GELU mix-up (2-4e-4 on these
logits); LayerNorm eps 1e-6 vs 1e-5 moves the logits by only 7e-6..1.7e-5, so eps is asserted on its own.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from transformers import AutoModel, AutoModelForImageClassification, ViTForImageClassification

import hub_vit  # noqa: F401  (registers the timm and transformers classes)
from hub_vit.conversion import infer_spec, read_npz
from hub_vit.conversion.verify import find_reference
from hub_vit.conversion.writer import convert_to_folder

JAX = Path(__file__).resolve().parent / "fixtures" / "jax"
ATOL = 1e-5
CHECKPOINTS = sorted(p for p in JAX.glob("*/*.npz") if not p.name.endswith(".io.npz"))
# vit_jax: 4 models x {published (pre-Linen), linen} names; big_vision: 4 per-block + 2 scan.
assert len(CHECKPOINTS) == 14, [p.name for p in CHECKPOINTS]


def reference_for(ckpt: Path) -> dict[str, np.ndarray]:
    reference = find_reference(ckpt)
    assert reference is not None, f"no Google reference (*.io.npz) beside {ckpt.name}"
    with np.load(reference, allow_pickle=False) as io:
        return {k: io[k] for k in io.files}


def nchw(inputs: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(inputs).permute(0, 3, 1, 2).contiguous()  # Google's NHWC -> NCHW


def assert_close(name: str, ours: torch.Tensor, theirs: np.ndarray) -> None:
    ours_np = ours.detach().numpy()
    assert ours_np.shape == theirs.shape, f"{name}: shape {ours_np.shape} vs Google's {theirs.shape}"
    diff = float(np.abs(ours_np.astype(np.float64) - theirs).max())
    assert diff <= ATOL, f"{name}: max abs diff {diff:.3g} > {ATOL}"


def assert_flax_numerics(model: torch.nn.Module) -> None:
    """flax LayerNorm eps 1e-6 and tanh GELU, checked apart from the tolerance (which is marginal for eps)."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    gelus = [m for m in model.modules() if isinstance(m, torch.nn.GELU)]
    assert norms and all(m.eps == 1e-6 for m in norms), {m.eps for m in norms}
    assert gelus and all(m.approximate == "tanh" for m in gelus), {m.approximate for m in gelus}


def image_size(ref: dict[str, np.ndarray]) -> tuple[int, int]:
    return tuple(ref["inputs"].shape[1:3])


@pytest.mark.parametrize("ckpt", CHECKPOINTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_timm_custom_load_reproduces_google(ckpt: Path) -> None:
    """timm's pretrained path (`custom_load` -> `convert_npz_file(path, spec)`), every intermediate array."""
    ref = reference_for(ckpt)
    spec = infer_spec(read_npz(ckpt), img_size=image_size(ref))
    model = timm.create_model("hub_vit", pretrained=True, pretrained_cfg_overlay=dict(file=str(ckpt),
                                                                                      custom_load=True),
                              **spec.to_dict()).eval()
    assert_flax_numerics(model)
    x = nchw(ref["inputs"])
    with torch.no_grad():
        out = model.forward_all(x, output_hidden_states=True)
        assert_close("logits", model(x), ref["logits"])  # the fused SDPA path, as deployed
        assert_close("logits (forward_all)", out.logits, ref["logits"])
        assert_close("pre_logits", out.pre_logits, ref["pre_logits"])
        assert_close("pooled", model.pool(out.tokens)[0], ref["pooled"])
        assert_close("encoded", out.tokens, ref["encoded"])
        assert_close("block_outputs", torch.stack(out.hidden_states[1:]), ref["block_outputs"])
        assert_close("patch_embeddings", model.patch_embed.proj(x).permute(0, 2, 3, 1), ref["patch_embeddings"])
        if "tokens_with_posemb" in ref:  # big_vision: patch tokens + posemb, before cls is prepended
            tokens = out.hidden_states[0][:, model.num_prefix_tokens:]
            if spec.class_token and not spec.posemb_on_cls:
                assert_close("tokens_with_posemb", tokens, ref["tokens_with_posemb"])
            elif not spec.class_token:
                assert_close("tokens_with_posemb", out.hidden_states[0], ref["tokens_with_posemb"])
    assert np.array_equal(out.logits.argmax(-1).numpy(), ref["logits"].argmax(-1)), "top-1 differs"


@pytest.mark.parametrize("ckpt", CHECKPOINTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_transformers_folder_reproduces_google(ckpt: Path, tmp_path: Path) -> None:
    """`hub-vit convert`'s folder, loaded by transformers (Auto classes; native ViT for classic models) and timm."""
    ref = reference_for(ckpt)
    result = convert_to_folder(ckpt, tmp_path / "out", img_size=image_size(ref), progress=False)
    assert result.parity.mode == "reference" and result.parity.passed
    x = nchw(ref["inputs"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = AutoModelForImageClassification.from_pretrained(result.path).eval()
        backbone = AutoModel.from_pretrained(result.path).eval()
    assert_flax_numerics(clf)
    with torch.no_grad():
        out = clf(pixel_values=x, output_hidden_states=True)
        feats = backbone(pixel_values=x)
    assert_close("transformers logits", out.logits, ref["logits"])
    assert_close("transformers block outputs", torch.stack(out.hidden_states[1:]), ref["block_outputs"])
    assert_close("transformers last_hidden_state", feats.last_hidden_state, ref["encoded"])
    assert_close("transformers pooler_output", feats.pooler_output, ref["pre_logits"])
    assert np.array_equal(out.logits.argmax(-1).numpy(), ref["logits"].argmax(-1))

    native = result.path / "native"
    assert native.is_dir() == (ckpt.parent.name == "vit_jax" and "gap" not in ckpt.name
                               and "rep" not in ckpt.name), "native ViT folder exactly for classic ViTs"
    if native.is_dir():
        vit = ViTForImageClassification.from_pretrained(native).eval()
        with torch.no_grad():
            nout = vit(pixel_values=x, output_hidden_states=True)
        assert_close("native ViT logits", nout.logits, ref["logits"])
        assert_close("native ViT block outputs", torch.stack(nout.hidden_states[1:]), ref["block_outputs"])

    timm_model = timm.create_model(f"local-dir:{result.path}", pretrained=True).eval()
    with torch.no_grad():
        assert_close("timm local-dir logits", timm_model(x), ref["logits"])
