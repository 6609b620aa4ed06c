# Datasets: tokenize a natural corpus once, then cut it into chunks per context size; a Markov
# dataset builds its chain once, then draws sequences from it per context size. A tokenize or
# chunk job's cluster runtime comes from the corpus's size (ihsweep.cost); both stream their
# data, so their memory does not grow with it.


rule tokenize:
    output:
        [layout.dataset_file(name) for name in layout.TOKENIZE_FILES],
    log:
        layout.log("tokenize", layout.keyed("{data}", "{dkey}")),
    conda:
        "../../envs/train.yaml"
    resources:
        mem_mb=cost.DATA_JOB_MEM_MB,
        runtime=tokenize_runtime,
    params:
        spec=dataset_spec_json,
        out_dir=output_dir,
    shell:
        "python -m ihsweep.steps.tokenize --spec {params.spec:q}"
        " --out-dir {params.out_dir} > {log} 2>&1"


rule chunk:
    input:
        chunk_source,
    output:
        [layout.chunk_file(name) for name in layout.CHUNK_FILES],
    log:
        layout.log("chunk", layout.keyed("{data}", "{dkey}"), "C{ctx}"),
    conda:
        "../../envs/train.yaml"
    resources:
        mem_mb=cost.DATA_JOB_MEM_MB,
        runtime=chunk_runtime,
    params:
        spec=dataset_spec_json,
        out_dir=output_dir,
    shell:
        "python -m ihsweep.steps.chunk --spec {params.spec:q} --source-dir $(dirname {input})"
        " --context {wildcards.ctx} --out-dir {params.out_dir} > {log} 2>&1"


rule chain:
    input:
        chain_source,
    output:
        [layout.chain_file(name) for name in layout.CHAIN_FILES],
    log:
        layout.log("chain", layout.keyed("{grid}", "{ckey}")),
    conda:
        "../../envs/train.yaml"
    params:
        spec=chain_spec_json,
        out_dir=output_dir,
        source=chain_source_flag,
    shell:
        "python -m ihsweep.steps.chain --spec {params.spec:q} {params.source}"
        " --out-dir {params.out_dir} > {log} 2>&1"
