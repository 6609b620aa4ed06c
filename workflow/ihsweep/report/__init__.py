"""The report's HTML table pages (Snakemake's report shows a CSV only as a download)."""
