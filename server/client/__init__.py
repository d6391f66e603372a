"""Clients of the served classifier (sync and async, HTTP and gRPC, over tritonclient): `classifier`, the load
generator (`loadtest`) and readable failures (`errors`). Imports neither the runtime nor the front.
"""

from hub_vit.server.client.classifier import AsyncClassifier, Classifier
from hub_vit.server.client.errors import ClientClosed, ImageTooLarge, NoExplanation, NoQueueTimeouts
from hub_vit.server.client.images import ImageLike
from hub_vit.server.client.messages import Prediction, PreparedRequest, ServedConfig

# what a caller catches: a file too large to send, a request this server cannot honour (no rollout for its model, no
# per-request queue timeouts), a call after `close`; `errors` has the rest. What the methods return and take:
# `Prediction` (classify), `ServedConfig` (config), `PreparedRequest` (prepare, send), `ImageLike` (an image as given).
__all__ = ["AsyncClassifier", "Classifier", "ClientClosed", "ImageLike", "ImageTooLarge", "NoExplanation",
           "NoQueueTimeouts", "PreparedRequest", "Prediction", "ServedConfig"]
