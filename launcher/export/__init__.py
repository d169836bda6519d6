"""Trained weights out of llmtrain (and back in): Hugging Face layouts and files."""
