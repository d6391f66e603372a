"""`hub-vit serve` commands (placeholder until implemented)."""
