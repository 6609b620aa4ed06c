# Aggregates: emergence point per run, the law fit across runs, and their figures.


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
