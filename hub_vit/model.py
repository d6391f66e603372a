"""`VisionTransformer`: the one model module behind every hub-vit variant (classic ViT and SimpleViT alike).

The architecture is whatever the `ViTSpec` says; there is no second class for SimpleViT. The timm entry points
(`hub_vit.timm_plugin`) and the transformers classes (`hub_vit.hf`) both wrap this module unchanged.

No `from __future__ import annotations` here: torch.fx copies `forward`'s annotations into the traced graph's code,
which TorchScript can then not read back as strings (scripting a traced model fails on them).
"""

import contextlib
import math
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from hub_vit.layers import Block, MAPHead, PatchEmbed, lecun_normal_, posemb_sincos_2d, resample_pos_table
from hub_vit.variants import ViTSpec, check_image_size, to_2tuple


class ViTOutput(NamedTuple):
    """Everything one forward pass can report. Optional fields are None unless asked for.

    hidden_states: depth+1 tensors (B, N, D): the embeddings, then each block's output (before the final norm).
    attentions: depth tensors (B, heads, N, N), each row a probability distribution over the N tokens.
    pool_attention: MAP models only, the probe's attention over the tokens (B, heads, 1, N).
    """

    logits: torch.Tensor  # (B, num_classes), or (B, head_hidden_size) when the model has no head
    pre_logits: torch.Tensor  # (B, head_hidden_size): what the head reads
    tokens: torch.Tensor  # (B, N, D) after the final LayerNorm
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    pool_attention: torch.Tensor | None = None


# timm's names for the three poolings (`global_pool`), and back
_POOL_NAMES = {"tok": "token", "gap": "avg", "map": "map"}
_TIMM_POOLS = {name: pool for pool, name in _POOL_NAMES.items()}
# timm regularisation arguments that hub-vit models do not implement: accepted when they ask for nothing (timm's
# train.py always passes drop_rate, and may pass the others as 0)
_UNSUPPORTED_REGULARISATION = ("pos_drop_rate", "patch_drop_rate", "proj_drop_rate", "attn_drop_rate",
                               "drop_block_rate")


def _check_timm_regularisation(overrides: dict[str, Any], **rates: float) -> None:
    for name, rate in rates.items():
        if not (isinstance(rate, (int, float)) and 0 <= rate < 1):
            raise ValueError(f"{name} must be a number in [0, 1), got {rate!r}")
    for name in _UNSUPPORTED_REGULARISATION:
        value = overrides.pop(name, None)
        if value:
            raise ValueError(f"{name}={value!r} is not implemented by hub-vit models; supported regularisation: "
                             "drop_rate (dropout before the head) and drop_path_rate (stochastic depth)")


# timm hands a checkpoint it does not read itself (a Google `.npz`: `create_model(..., checkpoint_path="x.npz")`, or a
# pretrained_cfg with `custom_load`) to `model.load_pretrained(path)`. Reading weight files belongs above the model
# core, so the layer that can (hub_vit.timm_plugin: the npz converter and strict loading) registers its reader here.
CheckpointLoader = Callable[["VisionTransformer", str], None]
_checkpoint_loader: list[CheckpointLoader] = []  # the registered reader (at most one)


def register_checkpoint_loader(loader: CheckpointLoader) -> None:
    """Make `loader(model, path)` what `VisionTransformer.load_pretrained` calls (registering again replaces it)."""
    _checkpoint_loader[:] = [loader]


# The two functions below hold every shape-dependent branch of the forward pass. torch.fx keeps them as single calls
# (`torch.fx.wrap`, what timm's `register_notrace_function` does), so symbolic tracing (timm's features_only on ViTs,
# torchvision's create_feature_extractor) sees no control flow on traced values, and the traced graph still runs them.
@torch.jit.ignore
def check_pixels(x: torch.Tensor, in_chans: int, patch_size: int, filters: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """Clear errors for the classic mistakes (wrong rank, raw uint8 pixels, float pixels of another dtype than the
    patch `filters` outside autocast, wrong channel count, a size that is not a patch multiple); returns `x`
    unchanged. (The filters, not their dtype: a model traced by FX and then scripted hands this function a dtype as
    the integer TorchScript keeps it as, a tensor as itself.)"""
    # torch.jit.trace would bake each check's outcome into its graph; torch.compile and torch.export keep them as
    # shape guards (an export with a dynamic image size declares it as `patch * Dim`, which satisfies the check)
    if torch.jit.is_tracing():
        return x
    if x.ndim != 4:
        raise ValueError(f"expected a (batch, channels, height, width) image tensor, got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(
            f"expected normalised float pixels, got a {x.dtype} tensor; prepare images with the model's own "
            "transform: timm.data.create_transform(**timm.data.resolve_data_config(model=model)), or transformers' "
            "AutoImageProcessor of its folder"
        )
    weight_dtype = None if filters is None else filters.dtype
    if weight_dtype is not None and x.dtype != weight_dtype and not _autocasting(x.device.type):
        # else the patch conv's own "Input type (double) and bias type (float) should be the same"
        raise ValueError(f"the pixels are {x.dtype} and the model's weights {weight_dtype}: cast one to the other "
                         f"(pixels.to({weight_dtype}), or model.to({x.dtype})), or run under torch.autocast")
    if x.shape[1] != in_chans:
        raise ValueError(
            f"expected {in_chans} input channels, got {x.shape[1]} (input shape {tuple(x.shape)}); images must be NCHW"
        )
    check_image_size((x.shape[2], x.shape[3]), patch_size)
    return x


def _autocasting(device_type: str) -> bool:
    """Whether torch.autocast casts the ops' inputs on this device type (a type it does not know, such as meta: leave
    the dtypes to the ops)."""
    try:
        return torch.is_autocast_enabled(device_type)
    except RuntimeError:
        return True


def patch_tokens(x: torch.Tensor, cls_token: torch.Tensor | None, pos_embed: torch.Tensor | None, sincos: bool,
                 posemb_on_cls: bool, pos_grid: tuple[int, int]) -> torch.Tensor:
    """(B, D, h, w) patch-conv output -> (B, N, D) tokens with position embeddings (and the class token, if any).

    sincos: computed for the actual grid. Learned (`pos_embed` trained on `pos_grid`): resampled to (h, w);
    big_vision adds it to the patches only, vit_jax (`posemb_on_cls`) has a class-token slot and adds after the concat.
    """
    h, w = x.shape[-2], x.shape[-1]
    x = x.flatten(2).transpose(1, 2)  # (B, h*w, D), row-major patch order as in JAX
    if sincos:
        x = x + posemb_sincos_2d(h, w, x.shape[-1], dtype=x.dtype, device=x.device)
    elif pos_embed is not None and not posemb_on_cls:
        x = x + resample_pos_table(pos_embed, pos_grid, (h, w), 0)
    if cls_token is not None:
        x = torch.cat([cls_token.expand(x.shape[0], -1, -1).to(x.dtype), x], dim=1)
    if pos_embed is not None and posemb_on_cls:
        x = x + resample_pos_table(pos_embed, pos_grid, (h, w), 1)
    return x


torch.fx.wrap("check_pixels")
torch.fx.wrap("patch_tokens")


class VisionTransformer(nn.Module):
    """ViT / SimpleViT. `VisionTransformer(ViTSpec.from_variant("S/16", posemb="sincos2d", pool_type="gap"))`.

    Keyword overrides replace spec fields (this is how timm passes `num_classes=`, `img_size=`, `in_chans=`).
    Training-only regularisation, as timm's models take it (none of it changes the state dict): `drop_rate` is
    dropout on the features the head reads, `drop_path_rate` stochastic depth rising linearly to that rate over the
    blocks. `global_pool` may only name the model's own pooling ('token', 'avg' or 'map'): pooling is architecture.
    `block_fn` is the encoder-block class (timm's name): a subclass of `hub_vit.layers.Block` with the same
    parameters (the transformers wrapper passes one that transformers can checkpoint).

    `forward` is scriptable (`torch.jit.script`) and symbolically traceable (`torch.fx`); the spec-derived values it
    reads are plain attributes, kept in step with `spec` by its setter.
    """

    __jit_unused_properties__ = ["spec"]

    def __init__(self, spec: ViTSpec | None = None, *, drop_rate: float = 0.0, drop_path_rate: float = 0.0,
                 global_pool: str | None = None, dynamic_img_size: bool = False, dynamic_img_pad: bool = False,
                 block_fn: type[Block] = Block, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None, **overrides: Any) -> None:
        super().__init__()
        # timm's factory arguments (create_model(..., device="meta", dtype=torch.bfloat16)): built there, in that dtype
        with torch.device(device) if device is not None else contextlib.nullcontext():
            self._build(spec, drop_rate, drop_path_rate, global_pool, dynamic_img_pad, block_fn, overrides)
        if dtype is not None:
            self.to(dtype=dtype)

    def _build(self, spec: ViTSpec | None, drop_rate: float, drop_path_rate: float, global_pool: str | None,
               dynamic_img_pad: bool, block_fn: type[Block], overrides: dict[str, Any]) -> None:
        if spec is None:
            raise ValueError("VisionTransformer needs a ViTSpec, e.g. ViTSpec.from_variant('S/16')")
        # timm's dynamic_img_size=True asks for what these models always do: any image that tiles into whole patches
        if dynamic_img_pad:
            raise ValueError("dynamic_img_pad=True is not supported: images must tile into whole patches (any "
                             "multiple of the patch size works at any time, dynamic_img_size is always on); pad or "
                             "resize them first")
        _check_timm_regularisation(overrides, drop_rate=drop_rate, drop_path_rate=drop_path_rate)
        spec = spec.replace(**overrides) if overrides else spec
        if global_pool is not None and _TIMM_POOLS.get(global_pool) != spec.pool_type:
            raise ValueError(f"global_pool={global_pool!r}: this model pools with {_POOL_NAMES[spec.pool_type]!r} "
                             f"(pool_type {spec.pool_type!r}), and pooling is part of its architecture; pass "
                             f"global_pool={_POOL_NAMES[spec.pool_type]!r} or leave it out")
        self.spec = spec
        D = spec.width
        # architecture switches the forward pass reads (fixed for the module's life)
        self.pool_type = spec.pool_type
        self.posemb_sincos = spec.posemb == "sincos2d"
        self.posemb_on_cls = spec.posemb_on_cls
        # timm model attributes that timm's helpers (data config, features, optimizers) read
        self.num_classes = spec.num_classes
        self.num_features = D  # what forward_features gives per token (timm: before pooling and pre-logits)
        self.head_hidden_size = spec.head_hidden_size  # what the head reads (the pre-logits width, if any)
        self.embed_dim = D
        self.num_prefix_tokens = spec.num_prefix_tokens
        self.global_pool = _POOL_NAMES[spec.pool_type]
        self.has_class_token = spec.class_token
        self.dynamic_img_size = True  # (see dynamic_img_pad above)
        self.grad_checkpointing = False

        self.patch_embed = PatchEmbed(spec.in_chans, D, spec.patch_size, spec.img_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D)) if spec.class_token else None
        if spec.posemb == "learn":
            n_pos = spec.num_patches + (1 if spec.posemb_on_cls else 0)
            self.pos_embed = nn.Parameter(torch.zeros(1, n_pos, D))
        else:
            self.pos_embed = None  # sincos2d: computed for the actual grid on every forward, never stored
        # timm's stochastic-depth schedule, linspace(0, rate, depth), in plain Python (models are built on "meta" too)
        rates = [drop_path_rate * i / max(spec.depth - 1, 1) for i in range(spec.depth)]
        self.blocks = nn.ModuleList(
            block_fn(D, spec.num_heads, spec.mlp_dim, spec.layer_norm_eps, spec.gelu, rates[i])
            for i in range(spec.depth)
        )
        # timm's `final_norm=False` (and what prune_norm leaves): an identity in the LayerNorm's place, no weights
        self.norm = nn.LayerNorm(D, eps=spec.layer_norm_eps) if spec.final_norm else nn.Identity()
        self.attn_pool = None
        if spec.pool_type == "map":
            self.attn_pool = MAPHead(D, spec.num_heads, spec.mlp_dim, spec.layer_norm_eps, spec.gelu)
        if spec.rep_size:
            self.pre_logits = nn.Sequential()
            self.pre_logits.add_module("fc", nn.Linear(D, spec.rep_size))
            self.pre_logits.add_module("act", nn.Tanh())
        else:
            self.pre_logits = nn.Identity()
        self.head_drop = nn.Dropout(drop_rate) if drop_rate else nn.Identity()
        self.head = nn.Linear(self.head_hidden_size, spec.num_classes) if spec.num_classes else nn.Identity()
        self.feature_info = [
            dict(module=f"blocks.{i}", num_chs=D, reduction=spec.patch_size) for i in range(spec.depth)
        ]
        self.init_weights()

    # ---------------------------------------------------------------------------------------------------- spec
    @property
    def spec(self) -> ViTSpec:
        """The architecture (a frozen `ViTSpec`). Setting it (set_input_size, reset_classifier, pruning) also updates
        the plain attributes the scriptable forward reads (the patch size, the grid a learned posemb is stored at) and
        the sizes `patch_embed` describes."""
        return self._spec

    @spec.setter
    def spec(self, spec: ViTSpec) -> None:
        self._spec = spec
        self.in_chans = spec.in_chans
        self.patch_size = spec.patch_size
        self.pos_grid = spec.grid_size
        if "patch_embed" in self._modules:  # (built after the spec is first set)
            self.patch_embed.describe(spec.img_size, spec.patch_size)

    # ---------------------------------------------------------------------------------------------------- init
    def init_plan(self) -> dict[nn.Module, Callable[[nn.Module], None]]:
        """big_vision's initialisation as one entry per module that owns parameters: `fn(module)` writes that
        module's own (direct) parameters and nothing else, so an initialiser that visits modules one at a time
        (transformers' `_init_weights`) reproduces `init_weights()` exactly.

        lecun-normal patch conv, xavier-uniform q/k/v *each* (not the fused matrix), out and MLP kernels, MLP biases
        N(0, 1e-6), zero cls token, learned posemb N(0, 1/sqrt(D)) (vit_jax: 0.02), lecun-normal pre-logits, head
        zero (`head_zeroinit`) or xavier. The order is the order `init_weights()` draws random numbers in.
        """
        spec = self.spec
        plan: dict[nn.Module, Callable[[nn.Module], None]] = {
            self.patch_embed.proj: _init_patch_conv_,
            self: _init_tokens_,
        }
        plan.update({m: _init_layernorm_ for m in self.modules() if isinstance(m, nn.LayerNorm)})
        for block in self.blocks:
            plan[block.attn.qkv] = partial(_xavier_chunks_, chunks=3)
            plan[block.attn.proj] = partial(_xavier_chunks_, chunks=1)
            plan.update({block.mlp.fc1: _init_mlp_linear_, block.mlp.fc2: _init_mlp_linear_})
        if self.attn_pool is not None:
            pool = self.attn_pool
            plan[pool] = _init_probe_
            plan.update({pool.q: partial(_xavier_chunks_, chunks=1), pool.kv: partial(_xavier_chunks_, chunks=2),
                         pool.proj: partial(_xavier_chunks_, chunks=1)})
            plan.update({pool.mlp.fc1: _init_mlp_linear_, pool.mlp.fc2: _init_mlp_linear_})
        if spec.rep_size:
            plan[self.pre_logits.fc] = _init_pre_logits_
        if isinstance(self.head, nn.Linear):
            plan[self.head] = partial(_init_head_, zero=spec.head_zeroinit)
        return plan

    @torch.no_grad()
    def init_weights(self) -> None:
        """big_vision's init (see `init_plan`), so that training from scratch starts where big_vision starts."""
        if all(p.is_meta for p in self.parameters()):  # no values to set; `normal_` on meta would import dynamo (1 s)
            return
        for module, init in self.init_plan().items():
            init(module)

    @torch.no_grad()
    def _init_head(self) -> None:
        if isinstance(self.head, nn.Linear):
            _init_head_(self.head, zero=self.spec.head_zeroinit)

    # ---------------------------------------------------------------------------------------------------- forward
    def check_input(self, x: torch.Tensor) -> None:
        """Clear errors for the classic mistakes: wrong rank, raw uint8 pixels, wrong channel count, size not a
        patch multiple."""
        check_pixels(x, self.in_chans, self.patch_size)  # any float dtype: transformers' path casts it after this

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) pixels -> (B, N, D) tokens with position embeddings (and the class token, if any)."""
        if not torch.jit.is_scripting():  # a scripted model leaves the checks to the conv
            x = check_pixels(x, self.in_chans, self.patch_size, self.patch_embed.proj.weight)
        x = self.patch_embed(x)  # (B, D, h, w)
        return patch_tokens(x, self.cls_token, self.pos_embed, self.posemb_sincos, self.posemb_on_cls, self.pos_grid)

    @torch.jit.unused
    def _run_block(self, block: Block, x: torch.Tensor, return_attn: bool,
                   fused: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.grad_checkpointing and self.training:
            return checkpoint(block, x, return_attn, fused, use_reentrant=False)
        return block(x, return_attn, fused)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, N, D) normalised tokens, on the fused-attention path."""
        x = self.embed(x)
        if torch.jit.is_scripting():  # TorchScript cannot pass modules around, nor checkpoint
            for block in self.blocks:
                x, _ = block(x, False)
        else:
            for block in self.blocks:
                x, _ = self._run_block(block, x, False)
        return self.norm(x)

    def pool(self, tokens: torch.Tensor, return_attn: bool = False,
             fused: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, N, D) normalised tokens -> (B, D): class token, patch-token mean (big_vision: norm, then mean) or MAP."""
        if self.attn_pool is not None:
            return self.attn_pool(tokens, return_attn, fused)
        if self.pool_type == "tok":
            return tokens[:, 0], None
        return tokens[:, self.num_prefix_tokens:].mean(dim=1), None

    def forward_head(self, tokens: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """timm API: pooled (+ tanh pre-logits) features if `pre_logits`, else logits."""
        x = self.pre_logits(self.pool(tokens)[0])
        return x if pre_logits else self.head(self.head_drop(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_all(self, x: torch.Tensor, output_attentions: bool = False, output_hidden_states: bool = False,
                    fused_attention: bool = True) -> ViTOutput:
        """One pass that can also return every block's attention probabilities and hidden states.

        With `output_attentions=True` each block computes softmax(q k^T / sqrt(d)) explicitly (the SDPA kernel does
        not expose it); the logits equal the fused path's to float32 rounding. `fused_attention=False` takes the
        explicit path in every block without returning the probabilities.
        """
        x = self.embed(x)
        hidden: list[torch.Tensor] = [x]
        attns: list[torch.Tensor] = []
        for block in self.blocks:
            x, attn = self._run_block(block, x, output_attentions, fused_attention)
            hidden.append(x)
            if attn is not None:
                attns.append(attn)
        tokens = self.norm(x)
        pooled, pool_attn = self.pool(tokens, output_attentions, fused_attention)
        feats = self.pre_logits(pooled)
        return ViTOutput(
            logits=self.head(self.head_drop(feats)),
            pre_logits=feats,
            tokens=tokens,
            hidden_states=tuple(hidden) if output_hidden_states else None,
            attentions=tuple(attns) if output_attentions else None,
            pool_attention=pool_attn,
        )

    def head_is_constant(self) -> bool:
        """True when the logits cannot depend on the input: a linear head whose weight is all zero (freshly
        initialised by `head_zeroinit`, `reset_classifier`, a new `--num-classes` head), so every logit is its bias.
        Verification that compares such logits passes whatever the backbone computes."""
        return isinstance(self.head, nn.Linear) and not bool(self.head.weight.any())

    # ---------------------------------------------------------------------------------------------------- timm API
    def load_pretrained(self, checkpoint_path: str, prefix: str = "") -> None:
        """timm API: load a checkpoint timm does not read itself, such as Google's `.npz` (converted to fit this
        model), strictly, through the reader hub-vit's timm entry points register (`register_checkpoint_loader`).
        `prefix` (timm's key prefix inside an npz) is not needed: the converter finds the parameter tree itself."""
        if prefix:
            raise ValueError(f"prefix={prefix!r}: hub-vit's converter finds the parameter tree inside the .npz itself "
                             "(vit_jax and big_vision layouts); leave prefix out")
        if not _checkpoint_loader:
            raise RuntimeError("no checkpoint reader is registered: hub-vit's timm entry points register one when "
                               "they build a model (timm.create_model(...)); or read the file with "
                               "hub_vit.conversion.load_checkpoint and load its state dict")
        _checkpoint_loader[0](self, str(checkpoint_path))

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """New zero-initialised head for `num_classes` (0 = none). Pooling is part of the architecture and fixed."""
        if global_pool is not None and global_pool != self.global_pool:
            raise ValueError(f"this model's pooling is {self.global_pool!r}; it cannot be changed to {global_pool!r}")
        self.spec = self.spec.replace(num_classes=num_classes)
        self.num_classes = num_classes
        like = next(self.parameters())  # the new head's device and dtype: the model's (a bf16 model got fp32 ones)
        head = nn.Linear(self.head_hidden_size, num_classes, device=like.device, dtype=like.dtype) if num_classes else \
            nn.Identity()
        self.head = head.train(self.training)
        self._init_head()

    @torch.no_grad()
    def set_input_size(self, img_size: int | tuple[int, int] | None = None,
                       patch_size: int | tuple[int, int] | None = None) -> None:
        """timm API: make `img_size` (and optionally `patch_size`) the model's own input size, in place.

        A learned position embedding is resampled once to the new patch grid, with the function that loads weights
        at another size (`resample_posemb`: bilinear, corners aligned, as big_vision), and stays a trainable
        Parameter, so fine-tuning at the new resolution trains the resampled table; the class-token slot of a vit_jax
        embedding is kept as it is. A sincos table is computed from the grid on every forward, so only the spec
        changes. A new `patch_size` resamples the patch filters as timm's `PatchEmbed.set_input_size` does
        (`timm.layers.resample_patch_embed`, FlexiViT's pseudo-inverse resize) and keeps `img_size` unless given.
        `self.spec` follows (a saved folder loads back at the new size); `pretrained_cfg` keeps describing the
        checkpoint, as on timm's own ViT, and timm's record of the current size (`get_model_input_config`) is updated.
        Bad values raise `ValueError` before anything changes. Optimisers holding the old Parameters must be rebuilt.
        """
        changes: dict[str, Any] = {}
        if img_size is not None:
            changes["img_size"] = to_2tuple(img_size, "img_size")
        if patch_size is not None:
            ph, pw = to_2tuple(patch_size, "patch_size")
            if ph != pw:
                raise ValueError(f"patch_size must be square (hub-vit patches are p x p), got {patch_size!r}")
            changes["patch_size"] = ph
        old = self.spec
        spec = old.replace(**changes)  # validates: whole patches, positive sizes (the model is still untouched)
        if spec == old:
            return
        proj = self.patch_embed.proj
        new_proj = None
        if spec.patch_size != old.patch_size:
            try:
                from timm.layers import resample_patch_embed
            except ImportError as exc:  # remote code without timm: the resize needs timm's resampler
                raise ValueError("set_input_size(patch_size=...) needs timm (its resample_patch_embed)") from exc
            new_proj = nn.Conv2d(spec.in_chans, spec.width, kernel_size=spec.patch_size, stride=spec.patch_size,
                                 device=proj.weight.device, dtype=proj.weight.dtype)
            # (D, C, p, p) -> (D, C, p', p'): timm's defaults (bicubic, antialias), as its own ViT resizes
            new_proj.weight.copy_(resample_patch_embed(proj.weight, [spec.patch_size, spec.patch_size]))
            new_proj.bias.copy_(proj.bias)
            new_proj.weight.requires_grad_(proj.weight.requires_grad)
            new_proj.bias.requires_grad_(proj.bias.requires_grad)
        new_pos = None
        if self.pos_embed is not None and spec.grid_size != old.grid_size:
            pos = self.pos_embed  # (1, [1 +] gh*gw, D); the class-token slot (vit_jax) is not part of the grid
            new_pos = nn.Parameter(resample_pos_table(pos, old.grid_size, spec.grid_size, int(spec.posemb_on_cls)),
                                   requires_grad=pos.requires_grad)
        # nothing above can fail any more: commit
        if new_proj is not None:
            self.patch_embed.proj = new_proj
        if new_pos is not None:
            self.pos_embed = new_pos
        self.spec = spec
        for info in self.feature_info:
            info["reduction"] = spec.patch_size
        try:  # recent timm (1.0.31 here) records the current size apart from the checkpoint's pretrained_cfg
            from timm.models._input import update_model_input_size
        except ImportError:  # older timm, or remote code without timm: the spec is the record
            return
        # (timm records patch_size among the reconstruction arguments only when it was changed)
        update_model_input_size(self, spec.img_size, patch_size=spec.patch_size if patch_size is not None else None)

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        return {"pos_embed", "cls_token", "attn_pool.latent"}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        blocks = [(r"^blocks\.(\d+)", None), (r"^norm", (99999,))]
        return dict(stem=r"^cls_token|^pos_embed|^patch_embed", blocks=blocks)

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | Sequence[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """timm's feature API: outputs of the chosen blocks, as NCHW maps or NLC token sequences."""
        from timm.models._features import feature_take_indices

        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take, max_index = feature_take_indices(len(self.blocks), indices)
        B, _, H, W = x.shape
        gh, gw = H // self.spec.patch_size, W // self.spec.patch_size
        x = self.embed(x)
        blocks = self.blocks[: max_index + 1] if (stop_early or intermediates_only) else self.blocks
        outs: list[Any] = []
        for i, block in enumerate(blocks):
            x, _ = self._run_block(block, x, False)
            if i in take:
                y = self.norm(x) if norm else x
                prefix, y = y[:, : self.num_prefix_tokens], y[:, self.num_prefix_tokens:]
                if output_fmt == "NCHW":
                    y = y.reshape(B, gh, gw, -1).permute(0, 3, 1, 2).contiguous()
                outs.append((y, prefix) if return_prefix_tokens and self.num_prefix_tokens else y)
        if intermediates_only:
            return outs
        return self.norm(x), outs

    def prune_intermediate_layers(self, indices: int | Sequence[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        from timm.models._features import feature_take_indices

        take, max_index = feature_take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[: max_index + 1]
        # the spec follows, so a pruned model saves as a folder that loads back (config depth = blocks kept, and
        # final_norm=False for a pruned norm: its config would otherwise ask for norm weights the file lacks)
        self.spec = self.spec.replace(depth=max_index + 1, final_norm=self.spec.final_norm and not prune_norm)
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            # pooling is part of the architecture (a MAP pool is kept: forward_head still pools, to (B, width));
            # the pre-logits layer and the classifier go
            self.pre_logits = nn.Identity()
            self.spec = self.spec.replace(rep_size=None)
            self.head_hidden_size = self.spec.head_hidden_size
            self.reset_classifier(0)
        return take


# big_vision's initialisers, one per kind of parameter-owning module (VisionTransformer.init_plan)
@torch.no_grad()
def _xavier_chunks_(linear: nn.Linear, chunks: int) -> None:
    """xavier-uniform each of `chunks` stacked (out/chunks, in) blocks separately, as flax inits q, k, v apart."""
    for w in linear.weight.chunk(chunks, dim=0):
        nn.init.xavier_uniform_(w)
    nn.init.zeros_(linear.bias)


@torch.no_grad()
def _init_mlp_linear_(fc: nn.Linear) -> None:
    nn.init.xavier_uniform_(fc.weight)
    nn.init.normal_(fc.bias, std=1e-6)


@torch.no_grad()
def _init_patch_conv_(conv: nn.Conv2d) -> None:
    lecun_normal_(conv.weight, fan_in=conv.weight[0].numel())  # fan_in = C * p * p
    nn.init.zeros_(conv.bias)


@torch.no_grad()
def _init_tokens_(vit: VisionTransformer) -> None:
    if vit.cls_token is not None:
        nn.init.zeros_(vit.cls_token)
    if vit.pos_embed is not None:
        nn.init.normal_(vit.pos_embed, std=0.02 if vit.posemb_on_cls else 1 / math.sqrt(vit.embed_dim))


@torch.no_grad()
def _init_layernorm_(norm: nn.LayerNorm) -> None:
    nn.init.ones_(norm.weight)
    nn.init.zeros_(norm.bias)


@torch.no_grad()
def _init_probe_(pool: MAPHead) -> None:
    bound = math.sqrt(6.0 / (1 + pool.latent.shape[-1]))  # flax xavier on a (1, 1, D) probe: fan_in 1, fan_out D
    nn.init.uniform_(pool.latent, -bound, bound)


@torch.no_grad()
def _init_pre_logits_(fc: nn.Linear) -> None:
    lecun_normal_(fc.weight, fan_in=fc.in_features)
    nn.init.zeros_(fc.bias)


@torch.no_grad()
def _init_head_(head: nn.Linear, zero: bool) -> None:
    if zero:
        nn.init.zeros_(head.weight)
    else:
        nn.init.xavier_uniform_(head.weight)
    nn.init.zeros_(head.bias)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def token_means(hidden_states: Sequence[torch.Tensor]) -> torch.Tensor:
    """`ViTOutput.hidden_states` (the embeddings, then each block's (B, N, D) output) -> (B, depth, D): each block's
    output averaged over its tokens, the embeddings left out. What `hub_vit.domain_score` judges an image's domain
    on; the exported graph's `token_means` output and the served torch step compute it here."""
    return torch.stack([hidden.mean(dim=1) for hidden in hidden_states[1:]], dim=1)


def vision_transformer_of(model: object, caller: str) -> VisionTransformer:
    """`model` itself, or the `VisionTransformer` a transformers HubViT model holds as `.vit` (the same module: same
    weights, same outputs), so that hub-vit's functions take what either front door built. Else a TypeError naming
    what `caller` takes."""
    if isinstance(model, VisionTransformer):
        return model
    inner = getattr(model, "vit", None)
    if isinstance(inner, VisionTransformer):
        return inner
    raise TypeError(f"{caller} needs a hub-vit VisionTransformer (timm.create_model('simplevit_s16'), "
                    f"hub_vit.load_model_folder) or a transformers HubViT model (AutoModelForImageClassification of a "
                    f"hub-vit folder); got {type(model).__name__}")


__all__ = ["VisionTransformer", "ViTOutput", "count_parameters", "token_means", "vision_transformer_of"]
