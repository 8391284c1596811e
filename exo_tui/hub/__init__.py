"""The catalogue of models and Hugging Face downloads."""
