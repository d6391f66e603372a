"""`hub-vit train` commands (placeholder until implemented)."""
