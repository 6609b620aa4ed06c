# Probes: PS and LA per head, AR accuracy and rank per model, at every checkpoint of a run.


rule probe:
    input:
        layout.run_file(layout.RUN_JSON),
    output:
        heads=layout.probe_table("heads", layout.run_dir()),
        model=layout.probe_table("model", layout.run_dir()),
    log:
        layout.run_log("probe", None, "{rkey}", "{pkey}"),
    conda:
        "../../envs/train.yaml"
    threads: EXECUTION_SETTINGS["threads"]
    resources:
        **rule_resources(EXECUTION_SETTINGS, "probe", **gpu_resources(run_gpus)),
        runtime=probe_runtime,
    params:
        probe=probe_json,
        run_dir=input_dir,
    shell:
        "python -m ihsweep.steps.probe --run-dir {params.run_dir} --probe {params.probe:q}"
        " --heads {output.heads} --model-table {output.model} %s > {log} 2>&1"
        % rule_flags("probe")


# One figure per run: its probe curves with the emergence point, and PS per head over time.
rule run_figure:
    input:
        unpack(run_probe_tables),
    output:
        png=report(
            layout.run_figures(layout.run_dir())[0],
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
        pdf=layout.run_figures(layout.run_dir())[1],
        provenance=layout.run_figures(layout.run_dir())[2],
    log:
        layout.run_log("run_figure", None, "{rkey}", "{fkey}"),
    conda:
        "../../envs/analysis.yaml"
    params:
        probes=input_dir,
        stem=output_stem,
        emergence=section_json("emergence"),
        run_sha256=run_figure_sha256,
    shell:
        "python -m ihsweep.steps.run_figure --probes {params.probes}"
        " --emergence {params.emergence:q} --out {params.stem}"
        " --run-sha256 {params.run_sha256} > {log} 2>&1"


# A checkpoint suite of a Hugging Face causal LM (e.g. Pythia): every revision, one at a time,
# into the same two tables as a run's; revisions probed before come from probes/<key>/cache/.
# The same loads fingerprint every revision: its duplicate groups are the suite's report page.
rule probe_suite:
    output:
        heads=layout.probe_table("heads", layout.suite_dir()),
        model=layout.probe_table("model", layout.suite_dir()),
        fingerprints=layout.suite_file(layout.FINGERPRINTS, layout.suite_dir()),
        duplicates=layout.suite_file(layout.DUPLICATES, layout.suite_dir()),
        page=report(
            layout.suite_file(layout.DUPLICATES_PAGE, layout.suite_dir()),
            caption="../report/suite_duplicates.rst",
            category="Checkpoint suites",
            subcategory="{suite}",
            labels={"suite": "{suite}", "table": "duplicate revisions"},
        ),
    log:
        layout.log("probe_suite", layout.keyed("{suite}", "{skey}"), "{pkey}"),
    conda:
        "../../envs/train.yaml"
    threads: EXECUTION_SETTINGS["threads"]
    resources:
        **rule_resources(EXECUTION_SETTINGS, "probe_suite", **gpu_resources(suite_gpus)),
        runtime=probe_runtime,
    params:
        suite=suite_spec_json,
        probe=probe_json,
    shell:
        "python -m ihsweep.steps.probe_suite --name {wildcards.suite} --suite {params.suite:q}"
        " --probe {params.probe:q} --heads {output.heads} --model-table {output.model}"
        " %s > {log} 2>&1" % rule_flags("probe_suite")
