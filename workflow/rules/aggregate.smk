# Aggregates: emergence point per run, the law fit across runs (natural data), the (f, r)
# frontier and the property grid (Markov data), and their figures. Cheap: they run beside the
# driver even when the other jobs go to a cluster.


EXPERIMENT_1 = "1. When: batch size, context size, model size"
EXPERIMENTS_2_3 = "2-3. Why: Markov data statistics"


localrules:
    figures,
    aggregate_natural,
    aggregate_markov,
    run_figure,


rule aggregate_natural:
    input:
        natural_model_tables(),
    output:
        emergence="results/natural/emergence.csv",
        fit="results/natural/lawfit.json",
        fit_table="results/natural/lawfit.csv",
        # The report shows HTML in a frame but a CSV only as a download: the tables as pages.
        emergence_html=report(
            "results/natural/emergence.html",
            caption="../report/natural_emergence.rst",
            category=EXPERIMENT_1,
            subcategory="Tables",
            labels={"table": "emergence per run"},
        ),
        fit_html=report(
            "results/natural/lawfit.html",
            caption="../report/lawfit.rst",
            category=EXPERIMENT_1,
            subcategory="Tables",
            labels={"table": "law fit"},
        ),
        figures=[
            report(
                f"results/natural/figures/{fig}.png",
                caption=f"../report/{fig}.rst",
                category=EXPERIMENT_1,
                subcategory="Figures",
                labels={"figure": fig.replace("_", " ")},
            )
            for fig in NATURAL_FIGURES
        ],
        pdfs=expand("results/natural/figures/{fig}.pdf", fig=NATURAL_FIGURES),
        provenance="results/natural/provenance.json",
    log:
        "results/logs/aggregate/natural.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        metric=config["emergence"]["metric"],
        method=config["emergence"]["method"],
        min_rise=config["emergence"]["min_rise"],
        bootstrap=config["lawfit"]["bootstrap"],
        seed=config["lawfit"]["seed"],
        config_sha256=CONFIG_SHA256,
    shell:
        "python -m ihsweep.aggregate --model-tables {input} --metric {params.metric}"
        " --method {params.method} --min-rise {params.min_rise}"
        " --bootstrap {params.bootstrap} --seed {params.seed}"
        " --emergence {output.emergence} --fit {output.fit} --fit-table {output.fit_table}"
        " --emergence-html {output.emergence_html} --fit-html {output.fit_html}"
        " --figures results/natural/figures --config-sha256 {params.config_sha256}"
        " > {log} 2>&1"


rule aggregate_markov:
    input:
        tables=markov_model_tables(),
        chunks=markov_chunk_metas(),
    output:
        tables=expand(
            "results/markov/{table}.csv", table=["emergence", "cells", "generator"]
        ),
        emergence_html=report(
            "results/markov/emergence.html",
            caption="../report/markov_emergence.rst",
            category=EXPERIMENTS_2_3,
            subcategory="Tables",
            labels={"table": "emergence per Markov run"},
        ),
        frontier="results/markov/frontier.json",
        figures=[
            report(
                f"results/markov/figures/{fig}.png",
                caption=f"../report/{fig.split('-')[0]}.rst",
                category=EXPERIMENTS_2_3,
                subcategory="Figures",
                labels={"figure": fig},
            )
            for fig in markov_figures()
        ],
        pdfs=expand("results/markov/figures/{fig}.pdf", fig=markov_figures()),
        provenance="results/markov/provenance.json",
    log:
        "results/logs/aggregate/markov.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        datasets=markov_datasets_json,
        config_sha256=CONFIG_SHA256,
        metric=config["emergence"]["metric"],
        method=config["emergence"]["method"],
        min_rise=config["emergence"]["min_rise"],
    shell:
        "python -m ihsweep.markov_aggregate --model-tables {input.tables}"
        " --datasets {params.datasets:q} --data-root results/data"
        " --metric {params.metric} --method {params.method} --min-rise {params.min_rise}"
        " --out results/markov --config-sha256 {params.config_sha256} > {log} 2>&1"


# `snakemake figures`: every figure and table again from the cached probe tables. After the
# figures are deleted it reruns only the plotting and aggregate jobs (byte-identical files).
rule figures:
    input:
        final_outputs(),
