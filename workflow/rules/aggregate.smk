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
        emergence=report(
            "results/natural/emergence.csv",
            caption="../report/natural_emergence.rst",
            category=EXPERIMENT_1,
            labels={"table": "emergence per run"},
        ),
        fit="results/natural/lawfit.json",
        fit_table=report(
            "results/natural/lawfit.csv",
            caption="../report/lawfit.rst",
            category=EXPERIMENT_1,
            labels={"table": "law fit"},
        ),
        figures=[
            report(
                f"results/natural/figures/{fig}.png",
                caption=f"../report/{fig}.rst",
                category=EXPERIMENT_1,
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
        " --figures results/natural/figures --config-sha256 {params.config_sha256}"
        " > {log} 2>&1"


rule aggregate_markov:
    input:
        tables=markov_model_tables(),
        chunks=markov_chunk_metas(),
    output:
        emergence=report(
            "results/markov/emergence.csv",
            caption="../report/markov_emergence.rst",
            category=EXPERIMENTS_2_3,
            labels={"table": "emergence per Markov run"},
        ),
        tables=expand("results/markov/{table}.csv", table=["cells", "generator"]),
        frontier="results/markov/frontier.json",
        figures=[
            report(
                f"results/markov/figures/{fig}.png",
                caption=f"../report/{fig.split('-')[0]}.rst",
                category=EXPERIMENTS_2_3,
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
