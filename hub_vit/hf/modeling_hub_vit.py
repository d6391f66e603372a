"""transformers models wrapping the one hub-vit module: `HubViTModel` and `HubViTForImageClassification`.

Both hold the very same `hub_vit.model.VisionTransformer` as `self.vit`; nothing is re-implemented. In memory the
parameters are `vit.<timm key>`; on disk (`model.safetensors`) they are the plain timm keys, exactly the file timm
loads: a registered checkpoint-conversion rule adds the `vit.` prefix on load and removes it on save, as transformers
does for its own `TimmWrapper` models.

This file is also bundled into saved model folders as transformers remote code (see `hub_vit.hf.remote_code`).
"""

from __future__ import annotations

import copy
import difflib
import json
import os
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPooling, ImageClassifierOutput
from transformers.utils import CONFIG_NAME, SAFE_WEIGHTS_INDEX_NAME, logging

from hub_vit.hf.configuration_hub_vit import (
    SPEC_FIELDS,
    TRAINING_FIELDS,
    VIT_DROPOUT,
    HubViTConfig,
    check_labels_file,
    label_at,
    refuse_vit_dropout,
    saved_label_names,
)
from hub_vit.hf.image_processing_hub_vit import PREPROCESSOR_FILE, write_processor_config
from hub_vit.layers import Block
from hub_vit.model import VisionTransformer
from hub_vit.network import HubUnreachableError, load_cache_only_when_unreachable
from hub_vit.variants import LABELS_FILE, to_2tuple
from hub_vit.weights import adapt_state_dict
from hub_vit.weights_check import check_values, check_weights_file

try:  # transformers >= 5 renames checkpoint keys through registered rules (load: add prefix; save: strip it)
    from transformers.conversion_mapping import register_checkpoint_conversion_mapping
    from transformers.core_model_loading import PrefixChange

    register_checkpoint_conversion_mapping("hub_vit", [PrefixChange(prefix_to_add="vit")], overwrite=True)
    _PREFIX_RULE: Any = PrefixChange
except ImportError:  # older 5.x: loading still works through base_model_prefix; saved files keep the prefix
    _PREFIX_RULE = None

logger = logging.get_logger(__name__)


class HubViTLayer(GradientCheckpointingLayer, Block):
    """The encoder block as transformers checkpoints it: `activation_checkpointing_enable(...)` sets this layer's
    `gradient_checkpointing` and checkpointing function (its kwargs, `every_n_layers`, `offload`). Same parameters
    and forward as `hub_vit.layers.Block`."""


def _vit(spec: Any, config: HubViTConfig) -> VisionTransformer:
    return VisionTransformer(spec, block_fn=HubViTLayer, drop_rate=config.drop_rate,
                             drop_path_rate=config.drop_path_rate)


def _refuse_unknown(cls: type, args: tuple, kwargs: dict[str, Any]) -> None:
    """What `from_pretrained` passes on to the model because the config has no such field (`image_size=64`), named
    with the field meant, instead of Python's bare "unexpected keyword argument"."""
    if args:
        raise TypeError(f"{cls.__name__} takes its config only; got {len(args)} more positional argument(s)")
    refuse_vit_dropout(kwargs)
    kwargs = {k: v for k, v in kwargs.items() if k not in VIT_DROPOUT}  # at 0: nothing asked
    if kwargs:
        bad = sorted(kwargs)[0]
        fields = [*SPEC_FIELDS, *HubViTConfig.attribute_map, *TRAINING_FIELDS]
        guess = difflib.get_close_matches(bad, fields, n=1, cutoff=0.7)
        raise TypeError(f"{cls.__name__}: unknown argument(s) {sorted(kwargs)}"
                        + (f" (did you mean {guess[0]!r}?)" if guess else "")
                        + f"; valid config fields: {', '.join((*SPEC_FIELDS, *TRAINING_FIELDS))}")


class HubViTPreTrainedModel(PreTrainedModel):
    """Shared plumbing: config class, the `vit` prefix, big_vision initialisation, gradient checkpointing."""

    config_class = HubViTConfig
    config: HubViTConfig
    base_model_prefix = "vit"
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    supports_gradient_checkpointing = True
    _no_split_modules = ["HubViTLayer"]
    # attn_implementation: "sdpa" (default) is F.scaled_dot_product_attention, "eager" the explicit softmax(q k^T)
    # path; output_attentions=True always takes the explicit one, which returns the probabilities it computed
    _supports_sdpa = True
    accepts_loss_kwargs = False
    # the keyword arguments forward() takes, named when it refuses another
    forward_arguments: tuple[str, ...] = ("pixel_values", "output_attentions", "output_hidden_states", "return_dict",
                                          "interpolate_pos_encoding")

    vit: VisionTransformer

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """big_vision's init for one module (`VisionTransformer.init_plan`: each entry writes only that module's own
        parameters), called by transformers for every module it has not loaded; a parameter it loaded (marked
        `_is_hf_initialized`) keeps its value."""
        init = self.vit.init_plan().get(module)
        if init is None:
            return
        kept = [(p, p.detach().clone()) for p in module.parameters(recurse=False)
                if getattr(p, "_is_hf_initialized", False)]
        init(module)
        for p, value in kept:
            p.copy_(value)

    def save_pretrained(self, save_directory: str | os.PathLike, *args: Any, **kwargs: Any) -> Any:
        """transformers' save (config.json + model.safetensors with plain timm keys), plus the remote-code files and
        their `auto_map`, so the folder also loads with `trust_remote_code=True` where hub_vit is not installed, and
        the model's own `preprocessor_config.json` unless the folder has one (a processor saved there first is kept):
        `AutoImageProcessor.from_pretrained` reads only that file, and the model alone holds its transform; and a
        classifier's `labels.txt`: the output is a whole hub-vit model folder (`push_to_hub` uploads one too)."""
        if _PREFIX_RULE is not None and getattr(self, "_weight_conversions", None) is None:
            # transformers only reverses the rename for models that came from from_pretrained; a model built in
            # memory must write the same plain timm keys
            self._weight_conversions = [_PREFIX_RULE(prefix_to_add="vit")]
        try:
            from hub_vit.hf.remote_code import AUTO_MAP, write_remote_code
        except ImportError:  # running as remote code already: transformers copies these files itself
            AUTO_MAP = write_remote_code = None
        if AUTO_MAP is not None:
            self.config.auto_map = dict(AUTO_MAP)
        # the module's own input size: timm's `self.vit.set_input_size(...)` resizes pos_embed / the patch filters
        # without knowing of this config, and a stale img_size would not load the saved weights back
        self.config.img_size = list(self.vit.spec.img_size)
        self.config.patch_size = self.vit.spec.patch_size
        self._labels_follow_head()
        result = super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            if write_remote_code is not None:
                write_remote_code(save_directory)
            if not os.path.exists(os.path.join(save_directory, PREPROCESSOR_FILE)):
                write_processor_config(save_directory, self.config.timm_config()["pretrained_cfg"])
            else:
                self._warn_if_processor_size_differs(save_directory)
            self._update_labels_file(save_directory)
            if os.path.exists(os.path.join(save_directory, SAFE_WEIGHTS_INDEX_NAME)):
                logger.warning(f"{save_directory}: the weights were saved in shards (max_shard_size); transformers "
                               "loads them, but timm and hub-vit's own commands read one model.safetensors: save "
                               "without max_shard_size for a folder all of them read")
        return result

    def _labels_follow_head(self) -> None:
        """A classifier whose head was resized behind its config's back (`model.vit.reset_classifier(3)`, timm's API)
        saves with as many labels as the head has: the config's old count and names no longer describe it, and such a
        folder did not load back ("config.json declares num_classes: 10, model.safetensors holds 3")."""
        classes = self.vit.spec.num_classes
        if not isinstance(self, HubViTForImageClassification) or classes == self.config.num_labels:
            return
        if not classes:
            raise ValueError("this classifier's head was removed (vit.reset_classifier(0)), so it would save a "
                             "folder that loads as no classifier; save the backbone instead: HubViTModel(model.config)"
                             " with load_state_dict(model.state_dict(), strict=False), or give the head classes again")
        logger.warning(f"the head has {classes} classes (resized with vit.reset_classifier), the config named "
                       f"{self.config.num_labels}: saved with {classes} labels, LABEL_0 ...; set config.id2label to "
                       "name them")
        self.config.num_labels = classes  # transformers' setter: a new count gets LABEL_i names
        self.num_labels = classes

    def _update_labels_file(self, folder: str | os.PathLike) -> None:
        """The folder's labels.txt (one class name per line, line i = class i), written from the saved id2label, so
        a saved classifier is a whole hub-vit model folder (Triton's repository reads it) and saving over a folder
        never leaves the old model's names beside the new head, which hub-vit's folder loader refuses; removed for a
        backbone, which has no classes."""
        path = os.path.join(folder, LABELS_FILE)
        if not self.vit.spec.num_classes:
            if os.path.isfile(path):
                os.remove(path)
            return
        names = [label_at(self.config.id2label, i) for i in range(self.vit.spec.num_classes)]
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(f"{name}\n" for name in names))

    def _warn_if_processor_size_differs(self, folder: str | os.PathLike) -> None:
        """The folder's own preprocessor_config.json is kept (a processor saved there first); one sized for another
        input than the model's (a folder saved over after `img_size=` / `resize_image`) is named, with the fix."""
        try:
            with open(os.path.join(folder, PREPROCESSOR_FILE), encoding="utf-8") as f:
                size = json.load(f).get("size") or {}
            kept = (int(size["height"]), int(size["width"]))
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return  # not a hub-vit processor's file: not ours to judge
        if kept != tuple(self.vit.spec.img_size):
            logger.warning(f"{PREPROCESSOR_FILE} in {folder} (kept) prepares {kept[0]}x{kept[1]} images, but the "
                           f"model saved there takes {self.vit.spec.img_size[0]}x{self.vit.spec.img_size[1]}: "
                           "save the model's processor there too, e.g. AutoImageProcessor.from_pretrained(folder, "
                           f"size={{'height': {self.vit.spec.img_size[0]}, 'width': {self.vit.spec.img_size[1]}}})"
                           ".save_pretrained(folder), or delete the file before saving to have it written anew")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: Any, *model_args: Any, **kwargs: Any) -> Any:
        """transformers' `from_pretrained`; asking for another image size (`img_size=`, or a `config` with one, as
        the Auto classes pass it) also resamples a saved *learned* position embedding to the new grid, as timm does
        on load, instead of failing on `vit.pos_embed` (or, with `ignore_mismatched_sizes=True`, silently
        re-initialising it).

        A Hub repo id while the Hub cannot be reached (an offline switch on, or no connection within a few seconds)
        loads from the local cache only, at once, with a warning; not cached, `HubUnreachableError` says both."""
        path = pretrained_model_name_or_path
        hint = _registered_name_hint(path)
        try:
            return load_cache_only_when_unreachable(path, kwargs, lambda given: cls._load(path, model_args, given),
                                                    CONFIG_NAME, hint)
        except HubUnreachableError:
            raise
        except OSError as err:
            if hint:
                raise OSError(f"{err}\n{hint}") from err
            raise

    @classmethod
    def _load(cls, pretrained_model_name_or_path: Any, model_args: tuple, kwargs: dict[str, Any]) -> Any:
        saved_config = _saved_config(pretrained_model_name_or_path, kwargs)  # read once: each read asks the Hub
        _check_saved_weights(pretrained_model_name_or_path, saved_config, kwargs)  # before anything is built or read
        _check_saved_labels(pretrained_model_name_or_path, saved_config, kwargs)
        config = kwargs.get("config")
        target = kwargs.get("img_size") if config is None else getattr(config, "img_size", None)
        saved = None if target is None else _saved_learned_grid_size(saved_config)
        if saved is None or to_2tuple(target) == saved:
            loaded = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
            model = loaded[0] if isinstance(loaded, tuple) else loaded  # (model, info) with output_loading_info
            check_values(model.vit.state_dict(), str(pretrained_model_name_or_path))  # NaN weights serve NaN
            return loaded
        if config is not None:  # load at the saved size first
            config = copy.deepcopy(config)
            config.img_size = list(saved)
            kwargs = {**kwargs, "config": config}
        else:
            kwargs = {k: v for k, v in kwargs.items() if k != "img_size"}
        loaded = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded
        check_values(model.vit.state_dict(), str(pretrained_model_name_or_path))
        model.resize_image(target)
        return loaded

    @torch.no_grad()
    def resize_image(self, img_size: int | tuple[int, int]) -> HubViTPreTrainedModel:
        """Rebuild for another input size, keeping every weight: a learned position embedding is resampled to the new
        grid (`hub_vit.weights.adapt_state_dict`); sincos ones are computed per forward anyway. Returns `self`."""
        spec = self.vit.spec.replace(img_size=img_size)
        if spec == self.vit.spec:
            return self
        param = next(self.vit.parameters())
        with torch.device("meta"):
            vit = _vit(spec, self.config)
        vit.load_state_dict(adapt_state_dict(self.vit.state_dict(), vit, self.vit.spec.grid_size), assign=True)
        vit.grad_checkpointing = self.vit.grad_checkpointing
        self.vit = vit.to(device=param.device, dtype=param.dtype).train(self.vit.training)
        self.config.img_size = list(spec.img_size)
        return self

    def get_input_embeddings(self) -> nn.Module:
        return self.vit.patch_embed.proj

    def load_state_dict(self, state_dict: dict[str, torch.Tensor], *args: Any, **kwargs: Any) -> Any:
        """Accept plain timm keys too (e.g. Trainer resuming from a model.safetensors written by save_pretrained)."""
        state_dict = {k if k.startswith("vit.") else f"vit.{k}": v for k, v in state_dict.items()}
        return super().load_state_dict(state_dict, *args, **kwargs)

    @classmethod
    def from_vit(cls, vit: VisionTransformer, **config_kwargs: Any) -> HubViTPreTrainedModel:
        """Wrap an existing `VisionTransformer` (shared, not copied) in this transformers class.

        `config_kwargs` go to `HubViTConfig.from_spec` (e.g. `id2label=`, `pretrained_cfg=`, `architecture=`).
        """
        if not isinstance(vit, VisionTransformer):
            raise TypeError(f"expected a hub_vit VisionTransformer, got {type(vit).__name__}")
        config = HubViTConfig.from_spec(vit.spec, **config_kwargs)
        with torch.device("meta"):  # build the shell without allocating or initialising a second model
            wrapper = cls(config)
        if wrapper.vit.spec != vit.spec:
            raise ValueError(f"{cls.__name__} holds a model with num_classes={wrapper.vit.spec.num_classes}, this one "
                             f"has {vit.spec.num_classes}; use HubViTForImageClassification for a model with a head "
                             "and HubViTModel for a headless one (vit.reset_classifier(0))")
        for block in vit.blocks:  # a timm-built module's blocks become checkpointable the transformers way (same
            if type(block) is Block:  # parameters and forward; only the class changes)
                block.__class__ = HubViTLayer
        wrapper.vit = vit
        return wrapper.to(device=next(vit.parameters()).device)

    def _check_kwargs(self, kwargs: dict[str, Any]) -> None:
        # ViT code passes interpolate_pos_encoding=True for other image sizes; here the position embedding always
        # follows the input size (sincos computed, learned resampled), so the flag (True, False or ViT's default None)
        # asks for what happens anyway
        unexpected = sorted(k for k in kwargs if k != "interpolate_pos_encoding")
        if unexpected:
            raise TypeError(f"{type(self).__name__}.forward() got unexpected argument(s) {unexpected}; "
                            f"valid arguments: {', '.join(self.forward_arguments)}")

    def _run(self, pixel_values: torch.Tensor, output_attentions: bool | None, output_hidden_states: bool | None):
        if pixel_values is None:
            raise ValueError("pixel_values is required: a (batch, channels, height, width) float tensor in [-1, 1]")
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        output_hidden_states = (self.config.output_hidden_states if output_hidden_states is None
                                else output_hidden_states)
        self.vit.check_input(pixel_values)  # before the cast below, which would hide raw uint8 pixels
        param = next(self.vit.parameters())
        pixel_values = pixel_values.to(device=param.device, dtype=param.dtype)
        return self.vit.forward_all(pixel_values, output_attentions=bool(output_attentions),
                                    output_hidden_states=bool(output_hidden_states),
                                    fused_attention=self.config._attn_implementation != "eager")


_HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder", "proxies")


def _registered_name_hint(name: Any) -> str:
    """For a name hub-vit registers with timm (`simplevit_s16`, `vit_b16.augreg_in21k_ft_in1k`), which is no folder
    and no Hub repository: how to get its weights into one; else ''."""
    if not isinstance(name, str) or os.path.exists(name):
        return ""
    try:  # not in the remote-code bundle: a folder loaded without hub_vit installed has no catalog to ask
        from hub_vit.catalog import get_entry

        get_entry(name.split(".")[0])
    except (ImportError, KeyError):
        return ""
    return (f"{name!r} names a hub-vit model in timm, not a folder or a Hugging Face Hub repository: "
            f"timm.create_model({name!r}, pretrained=True) builds it with Google's weights, and "
            f"`hub-vit convert {name} -o FOLDER` writes a folder that from_pretrained(FOLDER) loads")


def _hub_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The `from_pretrained` keywords that say where and how to fetch files, for hub-vit's own reads of them."""
    return {k: kwargs[k] for k in _HUB_KWARGS if k in kwargs}


def _saved_config(path: Any, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The config.json saved at `path` (a model folder or Hub repo), or None: no path (the weights come as
    `state_dict`, the config as `config`), or none readable (transformers then reports the problem itself). Read once
    per load: for a Hub repo each read is a request, and offline each one waits out huggingface_hub's retries."""
    if path is None:
        return None
    try:
        saved, _ = HubViTConfig.get_config_dict(path, **_hub_options(kwargs))
    except (OSError, ValueError, TypeError):
        return None
    return saved


def _check_saved_weights(path: Any, saved: dict[str, Any] | None, kwargs: dict[str, Any]) -> None:
    """The saved model.safetensors' header against the saved config.json that describes it (`saved`;
    `hub_vit.weights_check`): a mismatch (head included), a non-float dtype or an oversized tensor is refused
    before a module is built. What the caller changes on top (`num_labels` with `ignore_mismatched_sizes=True`,
    `img_size`) is transformers' business, as before. Nothing to compare (no safetensors file, no readable config):
    transformers reports it itself."""
    from transformers.utils import cached_file

    if saved is None or saved.get("model_type") != HubViTConfig.model_type:
        return
    try:
        weights = cached_file(path, "model.safetensors", _raise_exceptions_for_missing_entries=False,
                              **_hub_options(kwargs))
    except (OSError, ValueError, TypeError):
        return
    if weights is None:
        return
    config = HubViTConfig.from_dict({k: v for k, v in saved.items() if k != "transformers_version"})
    config.check_saved_model_args(saved.get("model_args"))
    spec = config.weights_spec()  # a backbone saved by HubViTModel keeps num_labels but saved no head
    check_weights_file(weights, spec, config="config.json", unrelated_ok=True)


def _check_saved_labels(path: Any, saved: dict[str, Any] | None, kwargs: dict[str, Any]) -> None:
    """A local model folder's labels.txt against its saved config.json's id2label (`check_labels_file`), as hub-vit's
    own folder loader checks them: the same folder must not answer with other class names there. A Hub repo is not
    asked for the file (a request per load); a folder without labels.txt, or not hub-vit's, has nothing to compare."""
    if saved is None or saved.get("model_type") != HubViTConfig.model_type or not isinstance(path, (str, os.PathLike)):
        return
    folder = os.path.join(path, kwargs.get("subfolder") or "")
    labels_path = os.path.join(folder, LABELS_FILE)
    id2label = saved.get("id2label")
    if not os.path.isfile(labels_path) or not isinstance(id2label, dict):
        return
    with open(labels_path, encoding="utf-8") as f:
        labels = f.read().splitlines()
    check_labels_file(os.fspath(path), labels, saved_label_names(id2label))


def _saved_learned_grid_size(saved: dict[str, Any] | None) -> tuple[int, int] | None:
    """The saved image size (`saved`: the saved config) when the position embedding is learned, else None (nothing
    to resample, or no readable config: transformers then reports the problem itself)."""
    if saved is None or saved.get("posemb") != "learn" or not saved.get("img_size"):
        return None
    return to_2tuple(saved["img_size"])


class HubViTModel(HubViTPreTrainedModel):
    """The backbone without classifier: `last_hidden_state` (B, N, D) after the final LayerNorm and `pooler_output`
    (B, head_hidden_size): the pooled (class token / GAP / MAP) and, if the spec has one, tanh pre-logits features."""

    _keys_to_ignore_on_load_unexpected = [r"head\."]  # loading a classifier checkpoint into the backbone

    def __init__(self, config: HubViTConfig, *args: Any, **kwargs: Any) -> None:
        # the config keeps its labels (a classifier can be built from it, as from transformers' ViTModel's); the
        # module has no head, and a saved folder says so to timm (`HubViTConfig.weights_spec`)
        _refuse_unknown(type(self), args, kwargs)
        super().__init__(config)
        self.vit = _vit(config.to_spec().replace(num_classes=0), config)
        self.post_init()

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> BaseModelOutputWithPooling | tuple[torch.Tensor, ...]:
        self._check_kwargs(kwargs)
        out = self._run(pixel_values, output_attentions, output_hidden_states)
        result = BaseModelOutputWithPooling(
            last_hidden_state=out.tokens,  # (B, N, D)
            pooler_output=out.pre_logits,  # (B, head_hidden_size)
            hidden_states=out.hidden_states,  # depth+1 x (B, N, D): embeddings, then every block (before the norm)
            attentions=out.attentions,  # depth x (B, heads, N, N)
        )
        return_dict = self.config.return_dict if return_dict is None else return_dict
        return result if return_dict else result.to_tuple()


class HubViTForImageClassification(HubViTPreTrainedModel):
    """Backbone + linear head (`vit.head`); `logits` (B, num_labels) and, given `labels`, the loss."""

    forward_arguments = ("pixel_values", "labels", "output_attentions", "output_hidden_states", "return_dict",
                         "interpolate_pos_encoding")

    def __init__(self, config: HubViTConfig, *args: Any, **kwargs: Any) -> None:
        _refuse_unknown(type(self), args, kwargs)
        super().__init__(config)
        if not config.num_labels:
            raise ValueError("HubViTForImageClassification needs num_labels >= 1 (got 0); use HubViTModel for "
                             "features, or pass num_labels=... / id2label=...")
        self.num_labels = config.num_labels
        self.vit = _vit(config.to_spec(), config)
        self.post_init()

    def get_output_embeddings(self) -> nn.Module:
        return self.vit.head

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> ImageClassifierOutput | tuple[torch.Tensor, ...]:
        self._check_kwargs(kwargs)
        out = self._run(pixel_values, output_attentions, output_hidden_states)
        loss = None
        if labels is not None:
            loss = self.loss_function(labels.to(out.logits.device), out.logits, self.config)
        result = ImageClassifierOutput(
            loss=loss,
            logits=out.logits,  # (B, num_labels)
            hidden_states=out.hidden_states,
            attentions=out.attentions,
        )
        return_dict = self.config.return_dict if return_dict is None else return_dict
        return result if return_dict else result.to_tuple()


__all__ = ["HubViTForImageClassification", "HubViTModel", "HubViTPreTrainedModel"]
