"""The torch flavour's model where the repository serves a calibrated out-of-domain score: the hub-vit model with each
image's token means (`hub_vit.model.token_means`, what `hub_vit.domain_score` reads) appended to its logits.

The flavour's runner (torch_runner.Runner: eager, CUDA graphs per batch bucket, the eager pass of explained requests)
returns one (N, C) output; with this model it is (N, C + depth * D), and the step's `DomainOutputs.split`
(templates/common/domain_outputs.py) takes the two apart where the answer is built. The pass is the model's own
`forward_all` with its hidden states kept (the fused attention path, as `forward`), so nothing is computed twice.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hub_vit.model import ViTOutput, token_means


class LogitsAndTokenMeans(nn.Module):
    """`forward(x)` -> (B, C + depth * D); `forward_all(x, ...)` -> the model's ViTOutput with the same `logits`."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.spec = model.spec

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._appended(self.model.forward_all(x, output_hidden_states=True))

    def forward_all(self, x: torch.Tensor, **options: Any) -> ViTOutput:
        out = self.model.forward_all(x, **(options | {"output_hidden_states": True}))
        return out._replace(logits=self._appended(out))

    @staticmethod
    def _appended(out: ViTOutput) -> torch.Tensor:
        return torch.cat([out.logits, token_means(out.hidden_states).flatten(1).to(out.logits.dtype)], dim=1)
