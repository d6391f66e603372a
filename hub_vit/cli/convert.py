"""`hub-vit convert` commands (placeholder until implemented)."""
