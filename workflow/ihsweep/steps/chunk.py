"""Rule ``chunk``: a dataset's train and validation chunks at one context size C.

    python -m ihsweep.steps.chunk --spec '<dataset entry JSON>' --source-dir DIR --context C \
        --out-dir results/data/<data>/C<C>

A natural dataset cuts the tokens of ``tokenize`` (``--source-dir`` = its folder) into chunks
with repetition control (``ihsweep.data.natural``); a Markov dataset draws sequences from the
chain of ``chain`` (``--source-dir`` = the chain folder; ``ihsweep.data.markov_chunks``).
"""

from __future__ import annotations

from ihsweep.config import complete
from ihsweep.data.markov_chunks import make_chunks
from ihsweep.data.natural import chunk_tokens
from ihsweep.steps import _args


@_args.reports_damage
def main(argv: list[str] | None = None) -> int:
    p = _args.parser("chunk", "Cut or draw the train/val chunks of a dataset at one C.")
    _args.add_spec(p, "--spec", "datasets.<name>")
    p.add_argument("--source-dir", required=True, help="tokens folder (natural) or chain folder")
    p.add_argument("--context", type=int, required=True, help="C, tokens per chunk")
    p.add_argument("--out-dir", required=True, help="folder for train.bin, val.bin, chunks.json")
    args = p.parse_args(argv)
    spec = complete("dataset", args.spec)
    if spec["family"] == "markov":
        meta = make_chunks(spec, args.source_dir, args.context, args.out_dir)
        train = meta["measured"]["train"]
        print(
            f"C={args.context}: {meta['n_train']} train / {meta['n_val']} val sequences; "
            f"f {train['f']:.3f} (asked {spec['frequency']}), r {train['r']:.3f} "
            f"(asked {spec['reliability']}) -> {args.out_dir}"
        )
        return 0
    meta = chunk_tokens(args.source_dir, args.context, spec, args.out_dir)
    train = meta["splits"]["train"]
    print(
        f"C={meta['context']}: {meta['n_train']} train / {meta['n_val']} val chunks; "
        f"repeated-bigram share {train['repeat_share_before']} -> "
        f"{train['repeat_share_after']}, copy share {train['copy_share']} -> {args.out_dir}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
