"""What is served on what: GPU presets, model shapes and presets, traffic."""
