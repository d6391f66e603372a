"""Clients of the served classifier (sync and async, HTTP and gRPC, over tritonclient): `classifier`, the load
generator (`loadtest`) and readable failures (`errors`). Imports neither the runtime nor the front.
"""

from hub_vit.server.client.classifier import AsyncClassifier, Classifier
from hub_vit.server.client.errors import ImageTooLarge, NoExplanation, NoQueueTimeouts
from hub_vit.server.client.messages import Prediction

# what a caller catches: a file too large to send, a request this server cannot honour (no rollout for its model, no
# per-request queue timeouts); `errors` has the rest
__all__ = ["AsyncClassifier", "Classifier", "ImageTooLarge", "NoExplanation", "NoQueueTimeouts", "Prediction"]
