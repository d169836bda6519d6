"""Checkpoints: writing and verifying them, loading them safely, consolidating, initialising from
them, when to write, Hugging Face export."""
