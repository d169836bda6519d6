"""Chat templates: rendering as transformers does, under a guarded sandbox and a budgeted child
process."""
