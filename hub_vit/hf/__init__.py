"""transformers front door (filled in by the HF work)."""
