"""Rule ``tokenize``: tokenize a natural dataset's corpus once (``ihsweep.data.natural``).

python -m ihsweep.steps.tokenize --spec '<dataset entry JSON>' --out-dir results/data/<data>
"""

from __future__ import annotations

from pathlib import Path

from ihsweep.config import complete
from ihsweep.data.corpus import CorpusError
from ihsweep.data.natural import tokenize_corpus
from ihsweep.steps import _args


@_args.reports_damage
def main(argv: list[str] | None = None) -> int:
    p = _args.parser("tokenize", "Tokenize a natural-text corpus into tokens.bin + tokens.json.")
    _args.add_spec(p, "--spec", "datasets.<name>")
    p.add_argument("--out-dir", required=True, help="folder for tokens.bin, tokenizer.json, ...")
    p.add_argument("--base-dir", default=".", help="folder that corpus paths are relative to")
    args = p.parse_args(argv)
    try:
        meta = tokenize_corpus(complete("dataset", args.spec), args.out_dir, args.base_dir)
    except CorpusError as err:  # say which dataset's corpus, as the config check does
        # The layout names a dataset's folder after the dataset.
        raise err.within(f"datasets.{Path(args.out_dir).name}.corpus") from None
    print(
        f"tokenized {meta['n_documents']} documents ({meta['n_text_bytes']} bytes) into "
        f"{meta['n_tokens']} tokens, vocab {meta['vocab_size']}, {meta['dtype']}, "
        f"in {sum(meta['seconds'].values()):.1f} s -> {args.out_dir}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
