"""Training data: preparing token shards (`llmtrain data prepare`) and their index."""
