"""The OpenAI- and Ollama-compatible HTTP API over a backend (`exo-tui serve`, `--api-port`)."""
