"""Clients of the served classifier (sync and async, HTTP and gRPC, over tritonclient): `classifier`, the load
generator (`loadtest`) and readable failures (`errors`). Imports neither the runtime nor the front.
"""

from hub_vit.server.client.classifier import AsyncClassifier, Classifier
from hub_vit.server.client.messages import Prediction

__all__ = ["AsyncClassifier", "Classifier", "Prediction"]
