"""Parallelism inside the model: expert parallel all-to-all, context parallel ring attention."""
