"""Headless commands: each `exo-tui` subcommand's work, with no Textual."""
