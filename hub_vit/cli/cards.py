"""`hub-vit cards` commands (placeholder until implemented)."""
