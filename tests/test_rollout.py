"""Rollout maths against hand-computed results on tiny synthetic attention tensors, and on real (tiny) models.

Expected values are worked out by hand in the comments (rows of `A + I`, renormalised, multiplied through layers);
none of them comes from running the code under test.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hub_vit import VisionTransformer, ViTSpec
from hub_vit.explain import attention_rollout, gradient_rollout, rollout_from_attentions
from hub_vit.explain.rollout import discard_lowest, fuse_heads


def one_hot_rows(n: int, k: int) -> torch.Tensor:
    """(n, n) attention where every token attends only to token k."""
    a = torch.zeros(n, n)
    a[:, k] = 1.0
    return a


def as_layers(*mats: torch.Tensor, heads: int = 1) -> list[torch.Tensor]:
    """(N, N) matrices -> list of (1, heads, N, N) attention tensors (all heads equal)."""
    return [m[None, None].expand(1, heads, *m.shape).clone() for m in mats]


# ---------------------------------------------------------------------------------------------- identity / uniform
@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
def test_identity_attention_gives_uniform_map_gap(fusion: str) -> None:
    # A = I: (I + I) renormalised is I, the product stays I, the mean of its rows is 1/N everywhere.
    maps = rollout_from_attentions(as_layers(*[torch.eye(16)] * 3, heads=2), (4, 4), readout_type="gap",
                                   head_fusion=fusion)
    assert maps.shape == (1, 3, 4, 4)
    torch.testing.assert_close(maps[0, -1], torch.full((4, 4), 1 / 16))


def test_identity_attention_class_token_stays_on_itself() -> None:
    # A = I: the class token never mixes with the patches, so the map is uniform (all zero) on the patches.
    maps = rollout_from_attentions(as_layers(*[torch.eye(5)] * 2), (2, 2), readout_type="tok", num_prefix_tokens=1)
    torch.testing.assert_close(maps[0, -1], torch.zeros(2, 2))


def test_uniform_attention_class_token_closed_form() -> None:
    # U = J/N is idempotent, so ((U + I)/2)^L = (I + (2^L - 1) U) / 2^L; class row, patch entry = (2^L - 1)/(2^L N).
    N, L = 5, 3
    maps = rollout_from_attentions(as_layers(*[torch.full((N, N), 1 / N)] * L), (2, 2), readout_type="tok",
                                   num_prefix_tokens=1)
    torch.testing.assert_close(maps[0, -1], torch.full((2, 2), (2**L - 1) / (2**L * N)))
    torch.testing.assert_close(maps[0, 0], torch.full((2, 2), 1 / (2 * N)))  # after one layer: U/2 + I/2


# ---------------------------------------------------------------------------------------------- one-token attention
def test_attention_on_one_token_peaks_there_class_token() -> None:
    # Every token attends to token 3 (patch (1, 0) of a 2x2 grid). Rows of (A + I)/2: row i = (e_i + e_3)/2,
    # row 3 = e_3. After L layers the class row is e_0 / 2^L + (1 - 2^-L) e_3.
    L = 3
    maps = rollout_from_attentions(as_layers(*[one_hot_rows(5, 3)] * L), (2, 2), readout_type="tok",
                                   num_prefix_tokens=1)
    expected = torch.tensor([[0.0, 0.0], [1 - 2**-L, 0.0]])
    torch.testing.assert_close(maps[0, -1], expected)


def test_attention_on_one_token_peaks_there_gap() -> None:
    # 2x2 grid, no class token, everything attends to token 2. Row 2 of the product is e_2; row i != 2 is
    # 2^-L e_i + (1 - 2^-L) e_2. Row mean: entry 2 = (1 + 3 (1 - 2^-L)) / 4, others 2^-L / 4.
    L = 2
    maps = rollout_from_attentions(as_layers(*[one_hot_rows(4, 2)] * L), (2, 2), readout_type="gap")
    peak, rest = (1 + 3 * (1 - 2**-L)) / 4, 2**-L / 4
    torch.testing.assert_close(maps[0, -1], torch.tensor([[rest, rest], [peak, rest]]))
    assert maps[0, -1].argmax() == 2


# ---------------------------------------------------------------------------------------------- head fusion
def two_head_layer() -> list[torch.Tensor]:
    """One layer of 4 tokens (2x2 grid, no class token): head 0 = identity, head 1 = every token attends to token 2."""
    return [torch.stack([torch.eye(4), one_hot_rows(4, 2)])[None]]  # (1, 2, 4, 4)


@pytest.mark.parametrize(("fusion", "peak", "rest"), [
    # mean: F = (I + K)/2; row i != 2: 1.5 e_i + 0.5 e_2 over 2 -> 0.75 e_i + 0.25 e_2; row 2: e_2.
    #       row mean: entry 2 = (1 + 3 * 0.25) / 4 = 0.4375, others 0.75 / 4 = 0.1875.
    ("mean", 0.4375, 0.1875),
    # max: F row i != 2 = e_i + e_2; + I -> (2 e_i + e_2)/3; row 2 = e_2. Mean: entry 2 = (1 + 3/3)/4 = 0.5, others 1/6.
    ("max", 0.5, 1 / 6),
    # min: F row i != 2 = 0, row 2 = e_2; + I renormalised = I. Mean: uniform 1/4.
    ("min", 0.25, 0.25),
])
def test_head_fusion_hand_computed(fusion: str, peak: float, rest: float) -> None:
    maps = rollout_from_attentions(two_head_layer(), (2, 2), readout_type="gap", head_fusion=fusion)
    torch.testing.assert_close(maps[0, 0], torch.tensor([[rest, rest], [peak, rest]]))


@pytest.mark.parametrize(("fusion", "value"), [
    # Class token + 2x2 patches; head 0 = identity, head 1 = every token attends to token 3 (patch (1, 0)).
    # mean: class row (e_0 + e_3)/2, + I -> (1.5 e_0 + 0.5 e_3) / 2 -> patch (1, 0) = 0.25.
    ("mean", 0.25),
    # max: class row e_0 + e_3, + I -> (2 e_0 + e_3) / 3 -> 1/3.
    ("max", 1 / 3),
    # min: class row min(e_0, e_3) = 0, + I -> e_0 -> nothing on the patches.
    ("min", 0.0),
])
def test_head_fusion_hand_computed_class_token(fusion: str, value: float) -> None:
    layer = [torch.stack([torch.eye(5), one_hot_rows(5, 3)])[None]]  # (1, 2, 5, 5)
    maps = rollout_from_attentions(layer, (2, 2), readout_type="tok", num_prefix_tokens=1, head_fusion=fusion)
    torch.testing.assert_close(maps[0, 0], torch.tensor([[0.0, 0.0], [value, 0.0]]))


def test_rows_are_renormalised_with_keepdim() -> None:
    # max fusion makes row sums differ (3 vs 2 after + I); a row sum broadcast along the wrong axis would give
    # different numbers from the hand-computed ones, and every row of the layer matrix must sum to 1.
    a = fuse_heads(two_head_layer()[0], "max")
    assert a.sum(-1).tolist() == [[2.0, 2.0, 1.0, 2.0]]
    maps = rollout_from_attentions(two_head_layer() * 2, (2, 2), readout_type="gap", head_fusion="max")
    assert torch.isclose(maps[0, -1].sum(), torch.tensor(1.0))


def test_fuse_heads_rejects_unknown() -> None:
    with pytest.raises(ValueError, match="'mean', 'max', 'min'"):
        fuse_heads(torch.rand(1, 2, 3, 3), "median")


# ---------------------------------------------------------------------------------------------- discard ratio
def test_discard_ratio_hand_computed() -> None:
    # Class token + 4 patches; class row [0.1, 0.4, 0.3, 0.15, 0.05]. discard_ratio 0.5 drops floor(0.5 * 4) = 2
    # patch entries (0.15, 0.05). + I: [1.1, 0.4, 0.3, 0, 0] / 1.8 -> patches [2/9, 1/6, 0, 0].
    a = torch.full((5, 5), 0.2)
    a[0] = torch.tensor([0.1, 0.4, 0.3, 0.15, 0.05])
    maps = rollout_from_attentions(as_layers(a), (2, 2), readout_type="tok", num_prefix_tokens=1, discard_ratio=0.5)
    torch.testing.assert_close(maps[0, 0], torch.tensor([[2 / 9, 1 / 6], [0.0, 0.0]]))


def test_discard_never_drops_diagonal_or_class_token() -> None:
    # Row 2 attends mostly to itself and the class token; with the largest ratio allowed they must survive.
    a = torch.full((1, 5, 5), 0.01)
    a[0, 2] = torch.tensor([0.3, 0.0, 0.6, 0.05, 0.05])
    out = discard_lowest(a, 0.99, num_prefix_tokens=1)
    assert out[0, 2, 0] == 0.3 and out[0, 2, 2] == 0.6
    assert (out[0, :, 0] == a[0, :, 0]).all() and (out[0].diagonal() == a[0].diagonal()).all()


@pytest.mark.parametrize("ratio", [-0.1, 1.0, "0.5", True])
def test_discard_ratio_out_of_range(ratio: object) -> None:
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        rollout_from_attentions(two_head_layer(), (2, 2), readout_type="gap", discard_ratio=ratio)


# ---------------------------------------------------------------------------------------------- MAP readout
def test_map_probe_combined_with_encoder_rollout() -> None:
    # Encoder: every token attends to token 1 -> product row i = (e_i + e_1)/2, row 1 = e_1 (one layer).
    # Probe attends only to token 3 -> relevance = row 3 of the product = [0, 0.5, 0, 0.5].
    probe = torch.tensor([0.0, 0.0, 0.0, 1.0])[None, None, None].expand(1, 2, 1, 4)
    maps = rollout_from_attentions(as_layers(one_hot_rows(4, 1), heads=2), (2, 2), readout_type="map",
                                   pool_attention=probe)
    torch.testing.assert_close(maps[0, 0], torch.tensor([[0.0, 0.5], [0.0, 0.5]]))


def test_token_count_must_match_grid() -> None:
    with pytest.raises(ValueError, match="grid 3x3"):
        rollout_from_attentions(as_layers(torch.eye(5)), (3, 3), readout_type="tok", num_prefix_tokens=1)


# ---------------------------------------------------------------------------------------------- batches
def random_attention(B: int, heads: int, N: int, depth: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, heads, N, N, generator=g).mul(3).softmax(-1) for _ in range(depth)]


@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
@pytest.mark.parametrize(("readout", "prefix"), [("tok", 1), ("gap", 0)])
def test_batch_equals_each_image_alone_synthetic(fusion: str, readout: str, prefix: int) -> None:
    attn = random_attention(4, 3, prefix + 9, 3, seed=1)
    batch = rollout_from_attentions(attn, (3, 3), readout_type=readout, num_prefix_tokens=prefix,
                                    head_fusion=fusion, discard_ratio=0.3)
    for b in range(4):
        alone = rollout_from_attentions([a[b:b + 1] for a in attn], (3, 3), readout_type=readout,
                                        num_prefix_tokens=prefix, head_fusion=fusion, discard_ratio=0.3)
        torch.testing.assert_close(batch[b:b + 1], alone)
    assert not torch.allclose(batch[0], batch[1])  # really different images, not element 0 repeated


def tiny_model(pool: str) -> VisionTransformer:
    spec = ViTSpec.from_variant("mu/8", img_size=32, num_classes=7, pool_type=pool, head_zeroinit=False, depth=2)
    return VisionTransformer(spec).eval()


@pytest.mark.parametrize("pool", ["tok", "gap", "map"])
def test_model_batch_equals_each_image_alone(pool: str) -> None:
    model = tiny_model(pool)
    x = torch.randn(3, 3, 32, 32)
    result = attention_rollout(model, x, head_fusion="max", discard_ratio=0.2)
    assert result.maps.shape == (3, 4, 4) and result.layer_maps.shape == (3, 2, 4, 4)
    torch.testing.assert_close(result.logits, model(x), atol=1e-5, rtol=1e-5)  # same logits as the fused path
    grads = gradient_rollout(model, x, labels=[0, 3, 6])
    for b in range(3):
        alone = attention_rollout(model, x[b:b + 1], head_fusion="max", discard_ratio=0.2)
        torch.testing.assert_close(result.maps[b], alone.maps[0], atol=1e-6, rtol=1e-5)
        g_alone = gradient_rollout(model, x[b:b + 1], labels=[0, 3, 6][b])
        torch.testing.assert_close(grads.maps[b], g_alone.maps[0], atol=1e-6, rtol=1e-5)
    if pool != "tok":  # GAP / MAP relevance is a distribution over the patches
        torch.testing.assert_close(result.maps.sum((1, 2)), torch.ones(3))


def test_gradient_rollout_depends_on_label() -> None:
    model = tiny_model("gap")
    x = torch.randn(1, 3, 32, 32)
    a, b = gradient_rollout(model, x, labels=1).maps, gradient_rollout(model, x, labels=4).maps
    assert a.shape == (1, 4, 4) and not torch.allclose(a, b)
    assert (a >= 0).all()  # positive part only, plus the identity


def test_gradient_rollout_hand_computed_relevance_rule() -> None:
    # One layer, 2x2 grid, gap readout. Attention K (every token attends to token 2), gradient 1 everywhere: the
    # positive part of grad * attn is K. R = I + K I: R[i, i] = 1, R[i, 2] = 1 for i != 2, R[2, 2] = 2.
    # Row mean: column 2 = (2 + 1 + 1 + 1) / 4 = 1.25, every other column 1/4.
    from hub_vit.explain import grad_rollout_from_attentions

    attn = [one_hot_rows(4, 2)[None, None]]
    grads = [torch.ones(1, 1, 4, 4)]
    maps = grad_rollout_from_attentions(attn, grads, (2, 2), readout_type="gap")
    torch.testing.assert_close(maps[0], torch.tensor([[0.25, 0.25], [1.25, 0.25]]))


def test_gradient_rollout_names_bad_labels_and_inference_mode() -> None:
    model, x = tiny_model("tok"), torch.randn(3, 3, 32, 32)
    with pytest.raises(ValueError, match=r"label\(s\) \[7\] out of range"):  # the label given, not [7, 7, 7]
        gradient_rollout(model, x, labels=7)
    with pytest.raises(ValueError, match="labels must be integer class indices, got torch.float32"):
        gradient_rollout(model, x, labels=[1.7, 0.2, 3.9])  # used to be truncated silently
    with torch.inference_mode(), pytest.raises(RuntimeError, match=r"outside torch.inference_mode\(\)"):
        gradient_rollout(model, x)


def test_gradient_rollout_rejects_bad_label() -> None:
    with pytest.raises(ValueError, match="0..6"):
        gradient_rollout(tiny_model("tok"), torch.randn(1, 3, 32, 32), labels=9)


@pytest.mark.parametrize(("readout", "prefix"), [("tok", 1), ("gap", 0)])
def test_row_chains_equal_full_matrix_products(readout: str, prefix: int) -> None:
    # The per-layer maps are computed as row-vector chains; they must equal the readout of the full N x N products.
    from hub_vit.explain.rollout import joint_attention

    attn = random_attention(2, 3, prefix + 16, 4, seed=3)
    maps = rollout_from_attentions(attn, (4, 4), readout_type=readout, num_prefix_tokens=prefix,
                                   head_fusion="min", discard_ratio=0.25)
    for depth in range(1, 5):
        joint = joint_attention(attn[:depth], "min", 0.25, prefix)  # (B, N, N)
        row = joint[:, 0] if readout == "tok" else joint.mean(dim=1)
        torch.testing.assert_close(maps[:, depth - 1].reshape(2, -1), row[:, prefix:])


def test_attentions_stacked_or_from_numpy_give_the_same_maps() -> None:
    # was: one (B, depth, heads, N, N) stack, the layout of an exported model.attentions.onnx, failed in `if not
    # attentions` ("Boolean value of Tensor with more than one value is ambiguous")
    model = tiny_model("tok")
    with torch.no_grad():
        layers = model.forward_all(torch.randn(2, 3, 32, 32), output_attentions=True).attentions
    stacked = torch.stack(layers, 1)
    expected = rollout_from_attentions(layers, (4, 4), readout_type="tok", num_prefix_tokens=1)
    for given in (stacked, stacked.numpy(), [a.numpy() for a in layers]):
        torch.testing.assert_close(rollout_from_attentions(given, (4, 4), readout_type="tok", num_prefix_tokens=1),
                                   expected, atol=0, rtol=0)
    with pytest.raises(ValueError, match=r"be \(batch, depth, heads, tokens, tokens\), got shape \(2, 2, 17, 17\)"):
        rollout_from_attentions(stacked[:, 0], (4, 4), readout_type="tok", num_prefix_tokens=1)


def test_a_transformers_model_is_explained_as_the_module_it_holds() -> None:
    # was: AttributeError 'HubViTForImageClassification' object has no attribute 'forward_all'
    from hub_vit.hf import HubViTConfig, HubViTForImageClassification

    model = tiny_model("map")
    wrapper = HubViTForImageClassification(HubViTConfig.from_spec(model.spec)).eval()
    wrapper.vit.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(attention_rollout(wrapper, x).maps, attention_rollout(model, x).maps, atol=0, rtol=0)
    torch.testing.assert_close(gradient_rollout(wrapper, x).maps, gradient_rollout(model, x).maps, atol=0, rtol=0)
    with pytest.raises(TypeError, match="attention_rollout needs a hub-vit VisionTransformer .* got Linear"):
        attention_rollout(torch.nn.Linear(2, 2), x)


def test_maps_explain_the_prediction_whatever_mode_the_model_is_in() -> None:
    # was: a model built with drop_path_rate and left in training mode (timm builds in training mode) gave another
    # map and other logits on every call
    import timm

    model = timm.create_model("simplevit_digits", pretrained=True, drop_path_rate=0.5).train()
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        reference = model.eval()(x)
    model.train()
    for rollout in (attention_rollout, gradient_rollout):
        first, second = rollout(model, x), rollout(model, x)
        assert torch.equal(first.maps, second.maps) and torch.allclose(first.logits, reference, atol=1e-6)
        assert model.training  # its own mode again
    with pytest.raises(TypeError, match="attention_rollout takes the pixels as a torch.Tensor .* got ndarray: "
                                        r"torch.from_numpy\(array\)"):
        attention_rollout(model, x.numpy())
    with pytest.raises(ValueError, match="labels must be integer class indices .* got '3'"):
        gradient_rollout(model, x, labels="3")


def test_blend_names_a_batch_of_maps_and_a_map_that_is_not_finite() -> None:
    # was: torch's own interpolate error for (B, h, w), and a NaN map drawn with a RuntimeWarning
    from PIL import Image

    from hub_vit.explain import blend

    image = Image.new("RGB", (64, 64))
    assert blend(image, torch.rand(8, 8)).shape == (64, 64, 3)
    with pytest.raises(ValueError, match=r"blend draws one map \(grid_h, grid_w\), got shape \(2, 8, 8\)"):
        blend(image, torch.rand(2, 8, 8))
    with pytest.raises(ValueError, match="the map holds NaN or infinite values"):
        blend(image, torch.full((8, 8), float("nan")))


class _DeviceResidentMap(torch.Tensor):
    """A map as a CUDA tensor behaves for numpy: unreadable until moved to the CPU (`.cpu()` gives a plain tensor).

    Emulates the one property of a GPU map that blend's drawing depends on, on a CPU-only host."""

    def __array__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host "
                        "memory first.")

    def numpy(self, *args: object, **kwargs: object) -> None:
        self.__array__()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = super().__torch_function__(func, types, args, kwargs)
        return out.as_subclass(torch.Tensor) if func is torch.Tensor.cpu else out


def test_blend_draws_a_map_that_lies_on_a_gpu() -> None:
    # rollout on a cuda model gives cuda maps; blend checked them with np.isfinite, which cannot read a device tensor
    from PIL import Image

    from hub_vit.explain import blend

    image = Image.new("RGB", (64, 48), (10, 200, 30))
    relevance = torch.rand(6, 8)
    on_device = relevance.as_subclass(_DeviceResidentMap)
    with pytest.raises(TypeError, match="can't convert cuda"):  # the emulation holds
        np.asarray(on_device)
    assert np.array_equal(blend(image, on_device, (4, 2, 60, 46)), blend(image, relevance, (4, 2, 60, 46)))
    with pytest.raises(ValueError, match="the map holds NaN or infinite values"):
        blend(image, torch.full((6, 8), float("inf")).as_subclass(_DeviceResidentMap))
