"""Analysis: emergence points, the law fit, the (f, r) frontier and the Markov run tables."""
