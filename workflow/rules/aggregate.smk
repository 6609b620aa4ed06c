# Aggregates: emergence point per run, the law fit across runs (natural data), the (f, r)
# frontier and the property grid (Markov data), and their figures. Cheap: they run beside the
# driver even when the other jobs go to a cluster.


localrules:
    aggregate_natural,
    aggregate_markov,


rule aggregate_natural:
    input:
        natural_model_tables(),
    output:
        emergence="results/natural/emergence.csv",
        fit="results/natural/lawfit.json",
        figures=expand(
            "results/natural/figures/{fig}.{ext}",
            fig=["run_curves", "emergence_vs_BC", "law_fit"],
            ext=["png", "pdf"],
        ),
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
    shell:
        "python -m ihsweep.aggregate --model-tables {input} --metric {params.metric}"
        " --method {params.method} --min-rise {params.min_rise}"
        " --bootstrap {params.bootstrap} --seed {params.seed}"
        " --emergence {output.emergence} --fit {output.fit}"
        " --figures results/natural/figures > {log} 2>&1"


rule aggregate_markov:
    input:
        tables=markov_model_tables(),
        chunks=markov_chunk_metas(),
    output:
        tables=expand(
            "results/markov/{table}.csv", table=["emergence", "cells", "generator"]
        ),
        frontier="results/markov/frontier.json",
        figures=expand(
            "results/markov/figures/{fig}.{ext}",
            fig=markov_figures(),
            ext=["png", "pdf"],
        ),
    log:
        "results/logs/aggregate/markov.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        datasets=markov_datasets_json,
        metric=config["emergence"]["metric"],
        method=config["emergence"]["method"],
        min_rise=config["emergence"]["min_rise"],
    shell:
        "python -m ihsweep.markov_aggregate --model-tables {input.tables}"
        " --datasets {params.datasets:q} --data-root results/data"
        " --metric {params.metric} --method {params.method} --min-rise {params.min_rise}"
        " --out results/markov > {log} 2>&1"
