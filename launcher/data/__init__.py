"""Token data on disk: formats that llmtrain writes and reads."""
