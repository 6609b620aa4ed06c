# Training: one job per (data, model, batch size, context size, seed). The declared output is
# the completion marker run.json; checkpoints, resume state and progress.json live beside it,
# undeclared, so that Snakemake never deletes them before a retry and a killed job resumes where
# it stopped. The `execution` settings are threads and resources, never params: changing how a
# run executes never retrains it, and --set-threads / --set-resources override them per rule.
# Which ones the rule takes, and its step's flags, come from the schema (rule_resources).
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
        **rule_resources(EXECUTION_SETTINGS, "train", **gpu_resources(run_gpus)),
        runtime=train_runtime,
    params:
        spec=train_spec_json,
        data_dir=input_dir,
        run_dir=output_dir,
    shell:
        "python -m ihsweep.steps.train --spec {params.spec:q} --data-dir {params.data_dir}"
        " --run-dir {params.run_dir} %s >> {log} 2>&1" % rule_flags("train")


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
