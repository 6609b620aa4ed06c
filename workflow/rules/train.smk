# Training: one job per (data, model, batch size, context size, seed). The declared output is
# the completion marker run.json; checkpoints, resume state and progress.json live beside it,
# undeclared, so that Snakemake never deletes them before a retry and a killed job resumes where
# it stopped. The `execution` settings are threads and resources, never params: changing how a
# run executes never retrains it, and --set-threads / --set-resources override them per rule.
# gpu, gpu_model, mem_mb and runtime are what a cluster job asks for; a local run ignores them.


rule train:
    input:
        run_chunks,
    output:
        layout.run_file(layout.RUN_JSON),
    log:
        layout.run_log("train"),
    conda:
        "../../envs/train.yaml"
    threads: EXECUTION_SETTINGS["threads"]
    resources:
        device=EXECUTION_SETTINGS["device"],
        progress_seconds=EXECUTION_SETTINGS["progress_seconds"],
        gpu=EXECUTION_SETTINGS["gpu"],
        gpu_model=EXECUTION_SETTINGS["gpu_model"] or "",
        mem_mb=EXECUTION_SETTINGS["train_mem_mb"],
        micro_batch=EXECUTION_SETTINGS["micro_batch"],
        compile=str(EXECUTION_SETTINGS["compile"]).lower(),
        vocab_padding=EXECUTION_SETTINGS["vocab_padding"],
        fused_loss=str(EXECUTION_SETTINGS["fused_loss"]).lower(),
        device_profile=EXECUTION_SETTINGS["device_profile"],
        runtime=train_runtime,
    params:
        spec=train_spec_json,
        data_dir=input_dir,
        run_dir=output_dir,
    shell:
        "python -m ihsweep.steps.train --spec {params.spec:q} --data-dir {params.data_dir}"
        " --run-dir {params.run_dir} --device {resources.device} --threads {threads}"
        " --progress-seconds {resources.progress_seconds} --micro-batch {resources.micro_batch}"
        " --memory-mb {resources.mem_mb} --compile {resources.compile}"
        " --vocab-padding {resources.vocab_padding} --fused-loss {resources.fused_loss}"
        " --device-profile {resources.device_profile:q} >> {log} 2>&1"


# `snakemake $(python -m ihsweep.where <run id>)/hf`: the run's newest checkpoint as a Hugging Face GPT-2 folder
# that transformers loads with no code of ours (python -m ihsweep.steps.export; not part of `all`).
rule export:
    input:
        layout.run_file(layout.RUN_JSON),
    output:
        directory(layout.export_dir()),
    log:
        layout.run_log("export"),
    conda:
        "../../envs/train.yaml"
    params:
        run_dir=input_dir,
    shell:
        "python -m ihsweep.steps.export {params.run_dir} {output} > {log} 2>&1"
