"""Probing: PS, LA and AR scores (SPEC section 1) and their tables over a run's checkpoints."""
