"""A chat turn with tools, the built-in tools, and the backend interface in front of a model."""
