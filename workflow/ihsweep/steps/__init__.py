"""Command modules, one per Snakemake rule and named after it (``python -m ihsweep.steps.<rule>``),
and the two pieces only the steps use: ``prepare`` (every check of a study before any job, which
the Snakefile runs) and ``stop_rule`` (the early-stop rule the train step hands the trainer).

A step reads its arguments, finds its files through ``ihsweep.files.layout`` or its flags, and
calls the science modules (data, training, probing, analysis, figures), which hold no argparse
and no knowledge of the results/ layout.
"""
