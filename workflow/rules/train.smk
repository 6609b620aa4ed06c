# Training: one job per (data, model, batch size, context size, seed). The declared output is
# the completion marker run.json; checkpoints and resume state live beside it, undeclared, so
# that Snakemake never deletes them before a retry and a killed job resumes where it stopped.


rule train:
    input:
        chunks="results/data/{data}/C{ctx}/chunks.json",
    output:
        RUN + "/run.json",
    log:
        "results/logs/train/{data}/{model}/B{batch}-C{ctx}-s{seed}.log",
    params:
        spec=train_spec_json,
        data_dir="results/data/{data}/C{ctx}",
        run_dir=RUN,
    threads: config["training"]["threads"]
    conda:
        "../../envs/train.yaml"
    shell:
        "python -m ihsweep.train --spec {params.spec:q} --data-dir {params.data_dir}"
        " --run-dir {params.run_dir} >> {log} 2>&1"
