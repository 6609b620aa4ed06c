# Training: one job per (data, model, batch size, context size, seed). The declared output is
# the completion marker run.json; checkpoints and resume state live beside it, undeclared, so
# that Snakemake never deletes them before a retry and a killed job resumes where it stopped.
# Device, threads and the progress interval are resources and the thread count, not `params`:
# changing how a run executes or logs never retrains it. gpu, gpu_model, mem_mb and runtime are what a cluster job asks for
# (config `resources`); a local run ignores them.


rule train:
    input:
        "results/data/{data}/C{ctx}/chunks.json",
    output:
        "results/runs/{data}/{model}/B{batch}-C{ctx}-s{seed}/run.json",
    log:
        "results/logs/train/{data}/{model}/B{batch}-C{ctx}-s{seed}.log",
    conda:
        "../../envs/train.yaml"
    threads: config["training"]["threads"]
    resources:
        device=config["training"]["device"],
        progress_seconds=config["training"]["progress_seconds"],
        gpu=config["resources"]["gpu"],
        gpu_model=config["resources"]["gpu_model"] or "",
        mem_mb=config["resources"]["train_mem_mb"],
        runtime=train_runtime,
    params:
        spec=train_spec_json,
        data_dir=input_dir,
        run_dir=output_dir,
    shell:
        "python -m ihsweep.train --spec {params.spec:q} --data-dir {params.data_dir}"
        " --run-dir {params.run_dir} --device {resources.device} --threads {threads}"
        " --progress-seconds {resources.progress_seconds}"
        " >> {log} 2>&1"
