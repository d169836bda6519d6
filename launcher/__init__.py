"""llmtrain: plan, validate and launch large-language-model pre-training."""

__version__ = "0.1.0"
