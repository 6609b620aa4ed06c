# Datasets: tokenize a natural corpus once, then cut it into chunks per context size; a Markov
# dataset builds its chain once, then draws sequences from it per context size.


rule tokenize:
    output:
        tokens="results/data/{data}/tokens.bin",
        tokenizer="results/data/{data}/tokenizer.json",
        meta="results/data/{data}/tokens.json",
    log:
        "results/logs/tokenize/{data}.log",
    conda:
        "../../envs/train.yaml"
    params:
        spec=dataset_spec_json,
        out_dir=output_dir,
    shell:
        "python -m ihsweep.data.natural tokenize --spec {params.spec:q}"
        " --out-dir {params.out_dir} > {log} 2>&1"


rule chunk:
    input:
        source=chunk_source,
    output:
        train="results/data/{data}/C{ctx}/train.bin",
        val="results/data/{data}/C{ctx}/val.bin",
        meta="results/data/{data}/C{ctx}/chunks.json",
    log:
        "results/logs/chunk/{data}/C{ctx}.log",
    conda:
        "../../envs/train.yaml"
    params:
        spec=dataset_spec_json,
        command=chunk_command,
        source_dir=input_dir,
        out_dir=output_dir,
    shell:
        "python -m {params.command} {params.source_dir}"
        " --context {wildcards.ctx} --spec {params.spec:q} --out-dir {params.out_dir}"
        " > {log} 2>&1"


rule chain:
    input:
        chain_source,
    output:
        chain="results/chains/{grid}/chain.npy",
        stationary="results/chains/{grid}/stationary.npy",
        meta="results/chains/{grid}/chain.json",
    log:
        "results/logs/chain/{grid}.log",
    conda:
        "../../envs/train.yaml"
    params:
        args=chain_args,
    shell:
        "python -m ihsweep.data.chains {params.args} > {log} 2>&1"
