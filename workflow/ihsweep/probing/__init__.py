"""Probing: PS, LA and AR scores and their tables over a run's checkpoints.

The scores are those of docs/method.md#prefix-matching-score-ps,
docs/method.md#logit-attribution-la and docs/method.md#associative-recall-ar, on the probe
batch of docs/method.md#the-probe-batch."""
