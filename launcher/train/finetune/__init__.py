"""Fine-tuning: LoRA/QLoRA adapters, their export, the masked loss of chat rows."""
