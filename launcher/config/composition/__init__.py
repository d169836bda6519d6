"""Composing a configuration: Hydra, the compose cache, --config files, overrides, group options,
provenance, presets, model.from_hf."""
