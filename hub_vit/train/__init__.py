"""hub_vit.train: the "Better plain ViT baselines" recipe (`hub-vit train`) and the shipped digits model.

Modules: `recipe` (every setting, big_vision's defaults), `data` (image folders, timm transforms, seeded stream and
Mixup), `schedule` (AdamW + cosine warm-up matching big_vision), `loop` (`train()`), `checkpoint`, `distributed`
(torchrun), `models` (start from a registered name or any model folder), `digits` (the default model's data/recipe).
Heavy imports stay in the modules so `import hub_vit.train` is cheap.
"""
