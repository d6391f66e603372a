"""hub-vit's version, in a leaf module: any layer may read it without importing the package's face (`hub_vit`),
which itself loads the model folder and the registration hooks."""

__version__ = "0.1.0"
