"""The "Better plain ViT baselines" recipe (big_vision `configs/vit_s16_i1k.py`) as one frozen, typed record.

Every setting of a run lives here, is overridable from the command line (`--set key=value`) and is written to the
run folder as `recipe.json`, so a run is reproducible from that file alone.

Weight decay: big_vision chains `clip -> scale_by_adam -> scale(lr) -> add_decayed_weights(wd) ->
scale_by_schedule(s) -> scale(-1)`, so one update is `p -= s(t) * (lr * adam_t + wd * p)`: the decay is multiplied by
the *schedule* `s(t)` in [0, 1] but not by the peak learning rate. PyTorch's AdamW does `p -= lr_t * wd_pt * p` with
`lr_t = lr * s(t)`, so the two agree when `wd_pt = wd / lr` (1e-4 / 1e-3 = 0.1 for the paper's config).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from hub_vit.cgroup_limits import usable_cores
from hub_vit.data_config import GOOGLE_EVAL, DataConfig

Precision = Literal["auto", "fp32", "bf16"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
Interpolation = Literal["bilinear", "bicubic", "nearest"]
INTERPOLATIONS: tuple[str, ...] = get_args(Interpolation)
MAX_DEFAULT_WORKERS = 4
MAX_STEPS = 2**53  # optimizer steps of a run: exact as a float, and far beyond any real run


class SettingError(ValueError):
    """A run setting with a value it cannot take. The message names the setting as `Recipe` (or `train()`) spells it
    (`total_steps`), outside quotes, so that a front end can put its own name for it in its place (`--steps`): no
    setting's name may stand in it as a plain word ("a CUDA device", "a model folder")."""


def default_workers() -> int:
    """4 data-loading workers, but no more than the cores this process may keep busy (`hub_vit.cgroup_limits`: its
    affinity mask, capped by its CPU quota): torch warns when a loader has more workers than it may run on, and they
    would only compete with the training threads. The count does not change results."""
    return max(1, min(MAX_DEFAULT_WORKERS, usable_cores()))


@dataclass(frozen=True)
class Recipe:
    """One training run. Defaults are the paper's ViT-S/16 ImageNet-1k config (90 epochs, batch 1024).

    `model`: a registered hub-vit name (`simplevit_s16`), or a model folder / weights file to fine-tune from.
    `total_steps` wins over `total_epochs` when set. `micro_batch` < `batch_size` turns on gradient accumulation;
    the optimiser always sees the mean gradient over `batch_size` images, whatever the number of processes.
    """

    model: str = "simplevit_s16"
    pretrained: bool = False  # registered names only: start from the catalog's published weights
    img_size: int = 224
    # --- optimisation (big_vision: optax_name='scale_by_adam', lr=0.001, wd=0.0001, grad_clip_norm=1.0)
    batch_size: int = 1024
    micro_batch: int | None = None
    total_epochs: float = 90.0
    total_steps: int | None = None
    lr: float = 1e-3
    wd: float = 1e-4  # big_vision's decoupled weight decay (see module docstring for the PyTorch mapping)
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    warmup_steps: int = 10_000
    grad_clip_norm: float = 1.0
    # --- data (big_vision: inception_crop(224) | flip_lr | randaug(2, 10) | value_range(-1, 1); mixup p=0.2)
    crop_area: tuple[float, float] = (0.05, 1.0)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    hflip: float = 0.5
    randaug: str = "rand-m10-n2-p1.0"  # timm config string; '' turns RandAugment off
    mixup: float = 0.2  # big_vision's `mixup.p`: the Beta(p, p) concentration, one ratio per batch; 0 = off
    interpolation: Interpolation = "bilinear"
    # eval: resize the shorter side to img_size / crop_pct (224 / 256), centre crop img_size
    eval_crop_pct: float = GOOGLE_EVAL.crop_pct
    # --- run
    seed: int = 0
    precision: Precision = "auto"  # auto = bf16 autocast on CUDA, fp32 on CPU
    workers: int = dataclasses.field(default_factory=default_workers)  # <= CPUs
    eval_every_epochs: float = 1.0
    checkpoint_every_steps: int = 1000
    log_every_steps: int = 10

    def __post_init__(self) -> None:
        _check_types(self)  # `--set wd=abc` names the setting instead of failing later inside a comparison
        set_ = object.__setattr__  # frozen: normalise JSON lists back to tuples once, here
        for name in ("crop_area", "crop_ratio"):
            raw = getattr(self, name)
            if not (isinstance(raw, (list, tuple)) and len(raw) == 2 and all(_is_number(v) for v in raw)):
                raise SettingError(f"{name} must be two numbers [min, max], got {raw!r}")
            value = (float(raw[0]), float(raw[1]))
            if not 0 < value[0] <= value[1]:
                raise SettingError(f"{name} must be two numbers 0 < min <= max, got {raw!r}")
            set_(self, name, value)
        if self.crop_area[1] > 1:
            raise SettingError(f"crop_area is a fraction of the image area in (0, 1], got {self.crop_area!r}")
        for name in ("batch_size", "img_size", "checkpoint_every_steps", "log_every_steps"):
            _positive_int(name, getattr(self, name))
        if self.micro_batch is not None:
            _positive_int("micro_batch", self.micro_batch)
        if self.total_steps is not None:
            _positive_int("total_steps", self.total_steps)
        # `not x > 0` / `not x >= 0` also refuse NaN (every comparison with NaN is False); inf never makes sense here
        for name in ("lr", "total_epochs", "eval_every_epochs", "eval_crop_pct", "eps"):
            value = float(getattr(self, name))
            if not 0 < value < math.inf:
                raise SettingError(f"{name} must be a finite number > 0, got {getattr(self, name)!r}")
        for name in ("wd", "mixup", "grad_clip_norm"):
            value = float(getattr(self, name))
            if not 0 <= value < math.inf:
                raise SettingError(f"{name} must be a finite number >= 0, got {getattr(self, name)!r}")
        for name in ("warmup_steps", "workers"):  # integers (checked above): "a finite number" asked for a float
            if getattr(self, name) < 0:
                raise SettingError(f"{name} must be an integer >= 0, got {getattr(self, name)!r}")
        # checked here, not when the model folder is written after the whole run (87.5 typed as a percentage)
        if self.eval_crop_pct > 1:
            raise SettingError(f"eval_crop_pct is the fraction of the resized image kept by the centre crop, in (0, 1] "
                               f"(e.g. 0.875), got {self.eval_crop_pct!r}")
        if not (0 <= self.b1 < 1 and 0 <= self.b2 < 1):
            raise SettingError(f"b1 and b2 are Adam's decay rates in [0, 1), got {self.b1!r}, {self.b2!r}")
        # torch.manual_seed takes at most 2**64 - 1 and numpy's SeedSequence no negative number (the per-image seeds
        # derived from it are 32-bit whatever the seed)
        if not 0 <= self.seed < 2**64:
            raise SettingError(f"seed must be an integer in [0, 2**64), got {self.seed!r}")
        if not 0 <= self.hflip <= 1:
            raise SettingError(f"hflip is a probability in [0, 1], got {self.hflip!r}")
        if self.randaug:
            _check_randaug(self.randaug)
        _choice("precision", self.precision, PRECISIONS)
        _choice("interpolation", self.interpolation, INTERPOLATIONS)

    # ------------------------------------------------------------------------------------------------ derived
    def eval_data(self) -> DataConfig:
        """The eval transform of the trained model (what its folder records, what validation runs): RGB,
        Google's mean = std = 0.5 (big_vision's value_range(-1, 1))."""
        return DataConfig(img_size=(self.img_size, self.img_size), crop_pct=self.eval_crop_pct,
                          interpolation=self.interpolation)

    @property
    def torch_weight_decay(self) -> float:
        """AdamW `weight_decay` equivalent to big_vision's decoupled `wd` (AdamW multiplies it by the lr)."""
        return self.wd / self.lr

    def steps_for(self, num_train: int) -> int:
        """Optimizer steps of the run: `total_steps`, else epochs * images / batch (big_vision's `total_epochs`)."""
        if self.total_steps is not None:
            return self.total_steps
        steps = self.total_epochs * num_train / self.batch_size
        if not steps < MAX_STEPS:  # `--epochs 1e307`: an OverflowError traceback (inf steps) or a run of 1e300 steps
            raise SettingError(f"total_epochs {self.total_epochs!r} makes more than {MAX_STEPS:.0e} steps of "
                               f"{self.batch_size} images on {num_train} images; use fewer --epochs, or --steps")
        return max(1, round(steps))

    def bf16_autocast(self, device_type: str) -> bool:
        """Whether the steps run under bf16 autocast on a device of `device_type` ("cuda", "cpu"): "bf16" always,
        "auto" on CUDA only, "fp32" never."""
        return self.precision == "bf16" or (self.precision == "auto" and device_type == "cuda")

    def steps_per_epoch(self, num_train: int) -> float:
        """Optimizer steps per pass over the data (not rounded: `epoch` in metrics.jsonl and the eval cadence must
        agree with training.json's `epochs`, which is steps * batch / images)."""
        return num_train / self.batch_size

    def steps_every(self, epochs: float, num_train: int) -> int:
        """The number of steps in `epochs` epochs, at least 1 (the eval cadence); `eval_every_epochs` beyond the run
        (1e300) gives a step count no run reaches, instead of an OverflowError."""
        steps = epochs * self.steps_per_epoch(num_train)
        return max(1, round(steps)) if steps < MAX_STEPS else MAX_STEPS

    def micro_batch_for(self, world_size: int) -> tuple[int, int]:
        """(images per process per forward pass, accumulation steps) that keep the global batch exact.

        Raises a ValueError naming the numbers when the batch does not split evenly across processes and passes.
        """
        if self.batch_size % world_size:
            raise SettingError(
                f"batch_size {self.batch_size} does not divide across {world_size} processes; use a multiple of "
                f"{world_size} (e.g. {max(1, self.batch_size // world_size) * world_size})"
            )
        per_rank = self.batch_size // world_size
        micro = min(self.micro_batch or per_rank, per_rank)
        if per_rank % micro:
            divisors = [d for d in range(1, per_rank + 1) if per_rank % d == 0]
            raise SettingError(
                f"micro_batch {micro} does not divide the per-process batch {per_rank} "
                f"(batch_size {self.batch_size} / {world_size} processes); valid micro batches: {divisors}"
            )
        if self.mixup and micro % 2:
            raise SettingError(self._odd_micro_batch(micro, per_rank, world_size))
        return micro, per_rank // micro

    def _odd_micro_batch(self, micro: int, per_rank: int, world_size: int) -> str:
        """Why mixup refuses an odd micro batch, and the values that work: other micro batches when micro_batch set
        it, else other batch sizes (the micro batch is then batch_size / processes)."""
        head = f"mixup needs an even number of images per forward pass (it pairs them), got {micro}"
        if micro < per_rank:
            even = [d for d in range(2, per_rank + 1, 2) if per_rank % d == 0]
            return (f"{head} (micro_batch); valid micro batches for the per-process batch {per_rank}: {even or 'none'}"
                    " (or mixup 0 to turn it off)")
        unit = 2 * world_size
        near = sorted({max(unit, self.batch_size // unit * unit), (self.batch_size // unit + 1) * unit})
        per = f" = batch_size {self.batch_size} / {world_size} processes" if world_size > 1 else " (batch_size)"
        return (f"{head}{per}; valid batch sizes: multiples of {unit} (e.g. {' or '.join(map(str, near))}), or "
                "mixup 0 to turn it off")

    # ------------------------------------------------------------------------------------------------ I/O
    def replace(self, **changes: Any) -> Recipe:
        unknown = set(changes) - set(FIELDS)
        if unknown:
            raise ValueError(f"unknown recipe setting(s) {sorted(unknown)}; valid settings: {', '.join(FIELDS)}")
        return dataclasses.replace(self, **changes)

    def with_overrides(self, assignments: list[str]) -> Recipe:
        """Apply `key=value` strings (values parsed as JSON when they parse, else kept as strings)."""
        changes: dict[str, Any] = {}
        for item in assignments:
            key, sep, raw = item.partition("=")
            key = key.strip().replace("-", "_")
            if not sep or key not in FIELDS:
                raise ValueError(f"--set expects KEY=VALUE with KEY one of: {', '.join(FIELDS)}; got {item!r}")
            if key in changes:  # was the last one, without a word
                raise ValueError(f"--set {key} is given twice; pass it once")
            try:
                value = json.loads(raw)
            except json.JSONDecodeError:
                value = raw
            changes[key] = value
        return self.replace(**changes)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["crop_area"], out["crop_ratio"] = list(self.crop_area), list(self.crop_ratio)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Recipe:
        unknown = set(data) - set(FIELDS)
        if unknown:
            raise ValueError(f"unknown recipe setting(s) {sorted(unknown)}; valid settings: {', '.join(FIELDS)}")
        return cls(**data)

    @classmethod
    def load(cls, path: str | Path) -> Recipe:
        """The recipe in a JSON file: `to_dict()` written out, or a run folder's `recipe.json` (`path` may be the run
        folder itself). Its run-record keys (`RUN_RECORD`: the starting weights `init` / `init_sha256`, `classes`,
        the `data` fingerprint, `effective_micro_batch`) describe what the run started from and on, not settings:
        they are dropped. To run it again, pass `init` (the recorded path) to `train()`; the classes and data come
        from the data folder, and a resumed run is compared with the record. Any other unknown key is refused."""
        path = Path(path)
        if path.is_dir():
            path = path / "recipe.json"
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"{str(path)!r} does not hold a recipe (a JSON object of settings)")
        return cls.from_dict({k: v for k, v in data.items() if k not in RUN_RECORD})


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Recipe))
# What a run folder's recipe.json records besides the settings (`hub_vit.train.run_folder.run_settings`)
RUN_RECORD: frozenset[str] = frozenset({"init", "init_sha256", "classes", "data", "effective_micro_batch"})


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# The type each annotation asks for (the Literal aliases are strings, checked against their choices afterwards).
_TYPE_CHECKS: dict[str, tuple[str, Any]] = {
    "str": ("a string", lambda v: isinstance(v, str)),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "int": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "float": ("a number", _is_number),
    "Precision": ("a string", lambda v: isinstance(v, str)),
    "Interpolation": ("a string", lambda v: isinstance(v, str)),
}


def _check_types(recipe: Recipe) -> None:
    for f in dataclasses.fields(recipe):
        value = getattr(recipe, f.name)
        annotation = str(f.type)
        optional = annotation.endswith(" | None")
        check = _TYPE_CHECKS.get(annotation.removesuffix(" | None"))
        if check is None or (optional and value is None):
            continue
        what, ok = check
        if not ok(value):
            raise SettingError(f"{f.name} must be {what}{' or null' if optional else ''}, got {value!r}")


# RandAugment config sections as timm's `rand_augment_transform` parses them: key -> value type ('t' names a set of
# ops). timm silently skips a section without digits ('rand-foo') and asserts on an unknown key: both are refused here.
_RANDAUG_KEYS: dict[str, type] = {"m": int, "n": int, "p": float, "mstd": float, "mmax": int, "inc": int}
_RANDAUG_OP_SETS = ("weights", "3a", "3aw")


def _check_randaug(config: str) -> None:
    """A ValueError naming the first part of a timm RandAugment string that timm would refuse with a bare
    AssertionError, or ignore without a word ('rand-m10-n2-x5', 'randfoo', 'rand-foo', 'rand-m9.5')."""
    sections = config.split("-")
    usage = ("; expected 'rand' then '-'-separated parts m<int> (magnitude), n<int> (ops per image), p<float> "
             f"(probability), mstd<float>, mmax<int>, inc<0|1> or t<{'|'.join(_RANDAUG_OP_SETS)}>, e.g. "
             "'rand-m10-n2-p1.0', or '' (off)")
    if sections[0] != "rand":
        raise SettingError(f"randaug {config!r} must be 'rand' or start with 'rand-' (timm RandAugment), not "
                           f"{sections[0]!r}{usage}")
    for part in sections[1:]:
        if part.startswith("t") and part[1:] in _RANDAUG_OP_SETS:
            continue
        match = re.fullmatch(r"(\D*)(\d.*)?", part)  # the key is everything before the first digit, as in timm
        key, value = (match.group(1), match.group(2) or "") if match else (part, "")
        kind = _RANDAUG_KEYS.get(key)
        try:
            number = kind(value) if kind is not None and value else None
        except ValueError:  # 'm9.5': timm reads m with int()
            number = None
        if number is None or not number >= 0:
            raise SettingError(f"randaug {config!r}: unknown or malformed part {part!r}{usage}")
        if key == "p" and number > 1:
            raise SettingError(f"randaug {config!r}: p is a probability in [0, 1], got {value}")


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SettingError(f"{name} must be a positive integer, got {value!r}")


def _choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SettingError(f"unknown {name} {value!r}; valid choices: {', '.join(map(repr, choices))}")


VIT_S16_I1K = Recipe()  # the paper's 90-epoch config; `Recipe(total_epochs=300)` for the 80.0 % run
