"""The transformer a rank trains: its modules, initial weights, MoE experts, fp8 layers, activation
checkpointing, the chunked loss."""
