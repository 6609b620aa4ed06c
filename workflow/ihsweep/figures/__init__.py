"""Figures: one shared style (style.py) and the figures of runs, natural data and Markov data."""
