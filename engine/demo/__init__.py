"""The bundled demo model."""
