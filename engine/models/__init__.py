"""The model store: find mlx-lm model folders and read their cards without loading any weights.

Every expected failure is a `ModelNotFoundError` or a `ModelFormatError` that names the folder,
file or value and says what to do. locations: where models live; finding: listing and resolving
them; cards: a folder's card; safetensors: the headers; weights: the weight index.
"""
