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
