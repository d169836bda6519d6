"""Training data on disk: `llmtrain data prepare`, the formats it writes and reads (llmtrain's
token shards, Megatron-LM's indexed datasets), documents from users' files, and blends."""
