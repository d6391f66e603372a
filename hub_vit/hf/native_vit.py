"""Classic ViT (vit_jax) as a native `transformers.ViTForImageClassification`: no custom code needed to load it.

Only the original ViT layout maps onto HF's ViT: class token pooling, a learned position embedding with a class-token
slot (`posemb_on_cls=True`), a linear head and no pre-logits layer. Flax's tanh GELU is `hidden_act=
"gelu_pytorch_tanh"` and LayerNorm eps is 1e-6 (HF's ViT default is 1e-12). Everything else raises a ValueError that
names the switch that prevents it.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import ViTConfig, ViTForImageClassification

from hub_vit.data_config import DataConfig
from hub_vit.model import VisionTransformer
from hub_vit.variants import ViTSpec

_HIDDEN_ACT = {"tanh": "gelu_pytorch_tanh", "erf": "gelu"}
_RESAMPLE = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}  # PIL codes


def native_vit_blockers(spec: ViTSpec) -> list[str]:
    """Why `spec` cannot be a native HF ViT (empty when it can)."""
    reasons = []
    if spec.pool_type != "tok":
        reasons.append(f"pool_type={spec.pool_type!r} (HF ViT classifies the class token: needs 'tok')")
    if spec.posemb != "learn":
        reasons.append(f"posemb={spec.posemb!r} (HF ViT has a learned position embedding: needs 'learn')")
    elif not spec.posemb_on_cls:
        reasons.append("posemb_on_cls=False (HF ViT adds the position embedding to the class token too: needs True)")
    if spec.rep_size:
        reasons.append(f"rep_size={spec.rep_size} (HF ViTForImageClassification has no tanh pre-logits layer)")
    if not spec.final_norm:
        reasons.append("final_norm=False (HF ViT always has its final layernorm: needs True)")
    if not spec.num_classes:
        reasons.append("num_classes=0 (a native classification folder needs a head)")
    return reasons


def native_vit_config(spec: ViTSpec, **kwargs: Any) -> ViTConfig:
    """The `ViTConfig` equal to a classic hub-vit spec (raises ValueError naming what prevents it)."""
    reasons = native_vit_blockers(spec)
    if reasons:
        raise ValueError("this model cannot be written as a native transformers ViTForImageClassification: "
                         + "; ".join(reasons))
    return ViTConfig(
        hidden_size=spec.width,
        num_hidden_layers=spec.depth,
        num_attention_heads=spec.num_heads,
        intermediate_size=spec.mlp_dim,
        hidden_act=_HIDDEN_ACT[spec.gelu],
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        layer_norm_eps=spec.layer_norm_eps,
        image_size=list(spec.img_size) if spec.img_size[0] != spec.img_size[1] else spec.img_size[0],
        patch_size=spec.patch_size,
        num_channels=spec.in_chans,
        qkv_bias=True,
        num_labels=spec.num_classes,
        **kwargs,
    )


def native_image_processor(pretrained_cfg: dict[str, Any]) -> Any:
    """A stock transformers processor doing timm's eval transform: resize to input / crop_pct, centre crop, [-1, 1].

    `CLIPImageProcessor` is transformers' generic resize-shorter-side + centre-crop processor; it matches timm's PIL
    pipeline to within one uint8 level (different resize kernels), and needs no custom code.
    """
    from transformers import CLIPImageProcessor

    data = DataConfig.from_pretrained_cfg(pretrained_cfg)  # the model's one eval transform
    if data.interpolation not in _RESAMPLE:
        raise ValueError(f"interpolation {data.interpolation!r} has no PIL resample code; valid: "
                         f"{', '.join(_RESAMPLE)}")
    (height, width), (scale_h, scale_w) = data.img_size, data.scale_size
    if height == width:
        size: dict[str, int] = {"shortest_edge": scale_h}
    else:  # timm resizes a non-square input to (H / crop_pct, W / crop_pct) exactly
        size = {"height": scale_h, "width": scale_w}
    return CLIPImageProcessor(
        size=size, crop_size={"height": height, "width": width}, resample=_RESAMPLE[data.interpolation],
        do_center_crop=True, do_rescale=True, do_normalize=True, do_convert_rgb=True,
        image_mean=list(data.mean), image_std=list(data.std),
    )


def native_state_dict(model: VisionTransformer) -> dict[str, torch.Tensor]:
    """hub-vit (timm) keys -> in-memory `ViTForImageClassification` keys; fused qkv split into q, k, v."""
    sd = model.state_dict()
    out = {
        "vit.embeddings.cls_token": sd["cls_token"],
        "vit.embeddings.position_embeddings": sd["pos_embed"],  # (1, 1+N, D): the class-token slot first, as HF
        "vit.embeddings.patch_embeddings.projection.weight": sd["patch_embed.proj.weight"],
        "vit.embeddings.patch_embeddings.projection.bias": sd["patch_embed.proj.bias"],
        "vit.layernorm.weight": sd["norm.weight"],
        "vit.layernorm.bias": sd["norm.bias"],
        "classifier.weight": sd["head.weight"],
        "classifier.bias": sd["head.bias"],
    }
    for i in range(model.spec.depth):
        src, dst = f"blocks.{i}.", f"vit.layers.{i}."
        for kind in ("weight", "bias"):
            q, k, v = sd[f"{src}attn.qkv.{kind}"].chunk(3, dim=0)  # rows [q; k; v], each (D, ...) head-major
            out.update({f"{dst}attention.q_proj.{kind}": q, f"{dst}attention.k_proj.{kind}": k,
                        f"{dst}attention.v_proj.{kind}": v})
            out[f"{dst}attention.o_proj.{kind}"] = sd[f"{src}attn.proj.{kind}"]
            out[f"{dst}layernorm_before.{kind}"] = sd[f"{src}norm1.{kind}"]
            out[f"{dst}layernorm_after.{kind}"] = sd[f"{src}norm2.{kind}"]
            out[f"{dst}mlp.fc1.{kind}"] = sd[f"{src}mlp.fc1.{kind}"]
            out[f"{dst}mlp.fc2.{kind}"] = sd[f"{src}mlp.fc2.{kind}"]
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def to_native_vit(model: VisionTransformer, **config_kwargs: Any) -> ViTForImageClassification:
    """A `ViTForImageClassification` with the same weights (and logits, to float32 rounding) as `model`."""
    config = native_vit_config(model.spec, **config_kwargs)
    native = ViTForImageClassification(config)
    native.load_state_dict(native_state_dict(model), strict=True)
    param = next(model.parameters())
    return native.to(device=param.device, dtype=param.dtype).eval()


__all__ = ["native_image_processor", "native_state_dict", "native_vit_blockers", "native_vit_config", "to_native_vit"]
