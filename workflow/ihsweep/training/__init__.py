"""Training: the model, the training loop and the checkpoint format (SPEC section 2)."""
