"""The parameters of a multimodal config's vision tower: a CLIP encoder under a LLaVA projector."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controlplane.catalog.architecture import VisionTower
from controlplane.catalog.config_values import config_count
from controlplane.catalog.errors import CatalogError

# LLaVA projectors: per wrapper model_type, the text-width vectors beside the two linear layers
# (LLaVA-NeXT's `image_newline`).
_LLAVA_PROJECTORS = {"llava": 0, "llava_next": 1}
_CLIP_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "image_size", "patch_size")


def vision_tower(config: Mapping[str, Any], text_hidden: int) -> VisionTower | None:
    """The vision encoder of a multimodal config, counted when it is CLIP under a LLaVA
    projector and the config gives the sizes (every encoder layer is counted, though a runtime
    may stop at the feature layer)."""
    vision = config.get("vision_config")
    if vision is None:
        return None
    if not isinstance(vision, Mapping):
        raise CatalogError("config_field_invalid", "vision_config",
                           f"config vision_config must be a JSON object, got {vision!r}")
    kind = str(vision.get("model_type") or "unknown")
    extra_vectors = _LLAVA_PROJECTORS.get(str(config.get("model_type")))
    if (kind != "clip_vision_model" or extra_vectors is None
            or any(vision.get(key) is None for key in _CLIP_KEYS)):
        return VisionTower(kind, None)
    try:
        h, inner, layers, image, patch = (config_count(vision, key) for key in _CLIP_KEYS)
        channels = config_count(vision, "num_channels", default=3)
    except CatalogError as error:
        raise CatalogError(error.code, f"vision_config.{error.field}",
                           error.message.replace("config ", "config vision_config.", 1)) from None
    # Patch convolution (no bias), class embedding, one position per patch and the class token.
    embeddings = channels * patch * patch * h + h + ((image // patch) ** 2 + 1) * h
    # q, k, v, o with biases; two layer norms; the MLP's two linear layers with biases.
    layer = 4 * (h * h + h) + 4 * h + (h * inner + inner) + (inner * h + h)
    encoder = embeddings + 2 * h + layers * layer + 2 * h  # pre- and post-layernorm
    return VisionTower(kind, encoder + _llava_projector(config, h, text_hidden, extra_vectors))


def _llava_projector(config: Mapping[str, Any], vision_hidden: int, text_hidden: int,
                     extra_vectors: int) -> int:
    feature_layer = config.get("vision_feature_layer", -2)
    features = len(feature_layer) if isinstance(feature_layer, list) else 1
    bias = config.get("multimodal_projector_bias", True) is not False
    first = vision_hidden * features * text_hidden + (text_hidden if bias else 0)
    second = text_hidden * text_hidden + (text_hidden if bias else 0)
    return first + second + extra_vectors * text_hidden
