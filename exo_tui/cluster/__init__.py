"""exo-tui."""
