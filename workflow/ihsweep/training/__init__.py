"""Training: the model, the training loop and the checkpoint format
(docs/method.md#the-model-and-training-runs)."""
