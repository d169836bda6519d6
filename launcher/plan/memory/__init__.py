"""Per-GPU memory: model states, activations, buffers, liveness; the estimate that sums them."""
