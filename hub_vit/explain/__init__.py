"""hub_vit.explain: attention rollout and class-specific gradient rollout for every hub-vit model (tok, gap, map).

```python
from hub_vit.explain import attention_rollout, gradient_rollout, blend
result = attention_rollout(model, x, head_fusion="mean", discard_ratio=0.0)   # result.maps: (B, grid_h, grid_w)
picture = blend(pil_image, result.maps[0])                                    # (H, W, 3) uint8
```
"""

from hub_vit.data_config import DataConfig  # the one data config, re-exported where rollout users look
from hub_vit.explain.grad_rollout import grad_rollout_from_attentions, gradient_rollout
from hub_vit.explain.image import ImageReadError, PreparedImage, load_image, prepare_image
from hub_vit.explain.overlay import COLORMAPS, blend, colorize, normalize_map, upsample_map
from hub_vit.explain.pipeline import Explainer
from hub_vit.explain.rollout import HEAD_FUSIONS, RolloutResult, attention_rollout, rollout_from_attentions

__all__ = [
    "COLORMAPS",
    "HEAD_FUSIONS",
    "DataConfig",
    "Explainer",
    "ImageReadError",
    "PreparedImage",
    "RolloutResult",
    "attention_rollout",
    "blend",
    "colorize",
    "grad_rollout_from_attentions",
    "gradient_rollout",
    "load_image",
    "normalize_map",
    "prepare_image",
    "rollout_from_attentions",
    "upsample_map",
]
