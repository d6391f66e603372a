"""`hub-vit explain` commands (placeholder until implemented)."""
