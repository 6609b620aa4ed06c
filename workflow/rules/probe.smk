# Probes: PS and LA per head, AR accuracy and rank per model, at every checkpoint of a run.


rule probe:
    input:
        RUN + "/run.json",
    output:
        heads=RUN + "/probes/heads.parquet",
        model=RUN + "/probes/model.parquet",
    log:
        "results/logs/probe/{data}/{model}/B{batch}-C{ctx}-s{seed}.log",
    params:
        probe=probe_json,
        run_dir=RUN,
    threads: 1
    conda:
        "../../envs/train.yaml"
    shell:
        "python -m ihsweep.probe --run-dir {params.run_dir} --probe {params.probe:q}"
        " --heads {output.heads} --model-table {output.model} --threads {threads} > {log} 2>&1"
