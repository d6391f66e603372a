"""`hub-vit export` commands (placeholder until implemented)."""
