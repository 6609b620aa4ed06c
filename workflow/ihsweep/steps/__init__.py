"""Command modules, one per Snakemake rule and named after it (``python -m ihsweep.steps.<rule>``).

A step reads its arguments, finds its files through ``ihsweep.layout`` or its flags, and calls
the science modules (data, training, probing, analysis, figures), which hold no argparse and no
knowledge of the results/ layout.
"""
