# Probes: PS and LA per head, AR accuracy and rank per model, at every checkpoint of a run.


rule probe:
    input:
        "results/runs/{data}/{model}/B{batch}-C{ctx}-s{seed}/run.json",
    output:
        heads="results/runs/{data}/{model}/B{batch}-C{ctx}-s{seed}/probes/heads.parquet",
        model="results/runs/{data}/{model}/B{batch}-C{ctx}-s{seed}/probes/model.parquet",
    log:
        "results/logs/probe/{data}/{model}/B{batch}-C{ctx}-s{seed}.log",
    conda:
        "../../envs/train.yaml"
    threads: 1
    resources:
        gpu=config["resources"]["gpu"],
        gpu_model=config["resources"]["gpu_model"] or "",
        mem_mb=config["resources"]["probe_mem_mb"],
        runtime=probe_runtime,
    params:
        probe=probe_json,
        run_dir=input_dir,
    shell:
        "python -m ihsweep.probe --run-dir {params.run_dir} --probe {params.probe:q}"
        " --heads {output.heads} --model-table {output.model} --threads {threads} > {log} 2>&1"


# One figure per run: its probe curves with the emergence point, and PS per head over time.
rule run_figure:
    input:
        heads="results/runs/{data}/{model}/B{batch}-C{ctx}-s{seed}/probes/heads.parquet",
        model="results/runs/{data}/{model}/B{batch}-C{ctx}-s{seed}/probes/model.parquet",
    output:
        png=report(
            "results/runs/{data}/{model}/B{batch}-C{ctx}-s{seed}/figures/run.png",
            caption="../report/run.rst",
            category="Runs",
            subcategory="{data}",
            labels={
                "data": "{data}",
                "model": "{model}",
                "B": "{batch}",
                "C": "{ctx}",
                "seed": "{seed}",
            },
        ),
        pdf="results/runs/{data}/{model}/B{batch}-C{ctx}-s{seed}/figures/run.pdf",
        provenance="results/runs/{data}/{model}/B{batch}-C{ctx}-s{seed}/figures/provenance.json",
    log:
        "results/logs/run_figure/{data}/{model}/B{batch}-C{ctx}-s{seed}.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        probes=input_dir,
        stem=lambda wildcards, output: output.png[: -len(".png")],
        metric=config["emergence"]["metric"],
        method=config["emergence"]["method"],
        min_rise=config["emergence"]["min_rise"],
        config_sha256=CONFIG_SHA256,
    shell:
        "python -m ihsweep.run_figures --probes {params.probes} --metric {params.metric}"
        " --method {params.method} --min-rise {params.min_rise} --out {params.stem}"
        " --config-sha256 {params.config_sha256} > {log} 2>&1"
