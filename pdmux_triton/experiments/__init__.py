"""The `run` and `capacity` experiments: their settings, estimate and searches."""
