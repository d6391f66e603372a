"""Building blocks of the one hub-vit model: position embeddings, attention, MLP, encoder block, MAP head.

Parameter names follow timm's `VisionTransformer` (`attn.qkv`, `attn.proj`, `mlp.fc1`, ...), so a hub-vit state dict
reads like a timm one and the transformers wrapper is the same dict under a `vit.` prefix.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx.experimental.symbolic_shapes import statically_known_true


def posemb_sincos_2d(h: int, w: int, width: int, temperature: float = 10_000.0,
                     dtype: torch.dtype = torch.float32, device: torch.device | None = None) -> torch.Tensor:
    """big_vision's `posemb_sincos_2d` ("MoCo v3 logic"), exactly: returns (1, h*w, width).

    `omega = 1 / temperature ** (arange(width/4) / (width/4 - 1))`; channels `[sin(x w), cos(x w), sin(y w), cos(y w)]`
    with x the column and y the row index, tokens in row-major order. Computed in float64 then cast, so the table is
    the same for every requested dtype and matches numpy to float32 rounding.

    Built on `device` itself: a table made on the CPU and copied to a CUDA input on every forward breaks CUDA graph
    capture ("Cannot copy between CPU and CUDA tensors during CUDA graph capture") and costs a host-to-device copy.
    """
    if width % 4:
        raise ValueError(f"sincos2d position embedding needs a width divisible by 4, got {width}")
    quarter = width // 4
    f64 = torch.float64
    y, x = torch.meshgrid(torch.arange(h, dtype=f64, device=device), torch.arange(w, dtype=f64, device=device),
                          indexing="ij")
    omega = torch.arange(quarter, dtype=f64, device=device) / max(quarter - 1, 1)
    omega = 1.0 / temperature**omega
    y = y.reshape(-1, 1) * omega  # (h*w, width/4)
    x = x.reshape(-1, 1) * omega
    pe = torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)
    return pe[None].to(dtype=dtype)


def _same_grid(old_grid: tuple[int, int], new_grid: tuple[int, int]) -> bool:
    """Whether the grids are known to be equal. A grid known only symbolically (torch.export or torch.compile with a
    dynamic image size) is not: the table is then resampled in the graph, which at the same size is exact
    (align_corners: every sample falls on a source point), where a comparison would pin the size to the traced one."""
    if torch.jit.is_scripting():  # TorchScript compiles only this branch; its sizes are plain ints
        same = old_grid[0] == new_grid[0] and old_grid[1] == new_grid[1]
    elif torch.jit.is_tracing():  # sizes may be traced 0-d tensors; the trace keeps the outcome for its own size
        same = bool(old_grid[0] == new_grid[0]) and bool(old_grid[1] == new_grid[1])
    else:
        same = statically_known_true(new_grid[0] == old_grid[0]) and statically_known_true(new_grid[1] == old_grid[1])
    return same


def resample_posemb(posemb: torch.Tensor, old_grid: tuple[int, int], new_grid: tuple[int, int]) -> torch.Tensor:
    """Resize a learned (1, h*w, D) position embedding to a new grid the way vit_jax and big_vision do.

    Both use `scipy.ndimage.zoom(order=1)`: linear interpolation whose corner samples coincide, i.e.
    `interpolate(mode="bilinear", align_corners=True)` without antialiasing. Computed in float32.
    """
    gh, gw = old_grid
    if _same_grid(old_grid, new_grid):
        return posemb
    if posemb.shape[1] != gh * gw:
        raise ValueError(f"position embedding has {posemb.shape[1]} tokens, expected {gh}x{gw}={gh * gw}")
    dtype = posemb.dtype
    grid = posemb.reshape(1, gh, gw, -1).permute(0, 3, 1, 2).float()  # (1, D, gh, gw)
    grid = F.interpolate(grid, size=(new_grid[0], new_grid[1]), mode="bilinear", align_corners=True)
    return grid.permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], -1).to(dtype)


def resample_pos_table(pos: torch.Tensor, old_grid: tuple[int, int], new_grid: tuple[int, int],
                       prefix: int) -> torch.Tensor:
    """A learned (1, prefix + h*w, D) position table resampled to `new_grid` (`resample_posemb`); the first `prefix`
    entries (vit_jax's class-token slot) are not part of the grid and are kept as they are."""
    if not prefix:
        return resample_posemb(pos, old_grid, new_grid)
    return torch.cat([pos[:, :prefix], resample_posemb(pos[:, prefix:], old_grid, new_grid)], dim=1)


class PatchEmbed(nn.Module):
    """(B, C, H, W) pixels -> (B, D, H/p, W/p): one p x p convolution with stride p (timm's key `patch_embed.proj`).

    It also carries the attributes of timm's `PatchEmbed` that code written for timm's ViTs reads (Grad-CAM reshape
    helpers, adapters): `img_size`, `patch_size` (pairs), `grid_size`, `num_patches` for the model's own input size
    (`VisionTransformer` keeps them current through `set_input_size`), and what its output is: not flattened, NCHW.
    """

    def __init__(self, in_chans: int, dim: int, patch_size: int,
                 img_size: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_chans, dim, kernel_size=patch_size, stride=patch_size)
        self.flatten = False
        self.output_fmt = "NCHW"
        self.dynamic_img_size = True  # any image that tiles into whole patches
        self.describe(img_size or (patch_size, patch_size), patch_size)

    def describe(self, img_size: tuple[int, int], patch_size: int) -> None:
        """Record the input size the model is set to (`img_size`, a multiple of `patch_size`)."""
        self.img_size = (int(img_size[0]), int(img_size[1]))
        self.patch_size = (patch_size, patch_size)
        self.grid_size = (self.img_size[0] // patch_size, self.img_size[1] // patch_size)
        self.num_patches = self.grid_size[0] * self.grid_size[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class Attention(nn.Module):
    """Multi-head self-attention with fused q/k/v weights (rows `[q; k; v]`, head-major within each).

    `forward(x, return_attn=False)` uses `scaled_dot_product_attention`; with `return_attn=True` it computes
    `softmax(q k^T / sqrt(d))` explicitly and returns the probabilities `(B, heads, N, N)` as well. `fused=False`
    takes the explicit path without returning them (transformers' "eager" attention).
    """

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, return_attn: bool = False,
                fused: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each (B, heads, N, head_dim)
        attn: torch.Tensor | None = None  # (annotated for TorchScript: None or a tensor)
        if return_attn or not fused:
            probs = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)  # (B, heads, N, N)
            x = probs @ v
            if return_attn:
                attn = probs
        else:
            x = F.scaled_dot_product_attention(q, k, v)
        x = x.transpose(1, 2).reshape(B, N, C)
        return self.proj(x), attn


class Mlp(nn.Module):
    """Dense -> GELU -> Dense (flax `MlpBlock`); `gelu='tanh'` is flax's default approximate GELU."""

    def __init__(self, dim: int, hidden: int, gelu: str) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU(approximate="tanh" if gelu == "tanh" else "none")
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm encoder block: `x + attn(norm1(x))`, then `x + mlp(norm2(x))`."""

    def __init__(self, dim: int, num_heads: int, mlp_dim: int, eps: float, gelu: str, drop_path: float = 0.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = Attention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = Mlp(dim, mlp_dim, gelu)
        # Stochastic depth (training only; no parameters): timm's layer, imported only when used, so the module and
        # the remote-code copy of it load without timm
        if drop_path > 0:
            from timm.layers import DropPath

            self.drop_path: nn.Module = DropPath(drop_path)
        else:
            self.drop_path = nn.Identity()

    def forward(self, x: torch.Tensor, return_attn: bool = False,
                fused: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        y, attn = self.attn(self.norm1(x), return_attn, fused)
        x = x + self.drop_path(y)
        x = x + self.drop_path(self.mlp(self.norm2(x)))
        return x, attn


class MAPHead(nn.Module):
    """big_vision `MAPHead`: a learned probe attends over the tokens, then a residual MLP; returns (B, D).

    Same structure and names as timm's `AttentionPoolLatent` (`latent`, `q`, `kv`, `proj`, `norm`, `mlp`).
    """

    def __init__(self, dim: int, num_heads: int, mlp_dim: int, eps: float, gelu: str) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.latent = nn.Parameter(torch.zeros(1, 1, dim))
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, dim * 2)
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.mlp = Mlp(dim, mlp_dim, gelu)

    def forward(self, x: torch.Tensor, return_attn: bool = False,
                fused: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, N, C = x.shape
        q = self.q(self.latent.expand(B, -1, -1)).reshape(B, 1, self.num_heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).reshape(B, N, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        attn: torch.Tensor | None = None
        if return_attn or not fused:
            probs = ((q * self.head_dim**-0.5) @ k.transpose(-2, -1)).softmax(dim=-1)  # (B, heads, 1, N)
            y = probs @ v
            if return_attn:
                attn = probs
        else:
            y = F.scaled_dot_product_attention(q, k, v)
        y = self.proj(y.transpose(1, 2).reshape(B, 1, C))
        y = y + self.mlp(self.norm(y))  # big_vision: x = MHA(probe, x); x = x + MLP(LN(x))
        return y[:, 0], attn


def lecun_normal_(tensor: torch.Tensor, fan_in: int) -> torch.Tensor:
    """flax's default kernel init: truncated normal (2 std) with variance 1/fan_in, corrected for the truncation."""
    std = math.sqrt(1.0 / fan_in) / 0.87962566103423978
    return nn.init.trunc_normal_(tensor, std=std, a=-2 * std, b=2 * std)
