"""What lies on disk and who may write it: atomic writes and checked reads (``io``),
every path under ``results/`` (``layout``), one writer per run (``lease``) and a run's
own records (``records``). The bottom layer: it imports nothing else of the package."""
