"""Rule ``chain``: the Markov chain that every cell of a Markov entry draws from
(``ihsweep.data.chains``).

    python -m ihsweep.steps.chain --spec '<chain JSON>' [--source-dir results/data/<source>] \
        --out-dir results/chains/<grid>

A bigram chain counts the tokens of its natural source (``--source-dir``, the tokenize folder);
a synthetic chain is optimised from its spec alone.
"""

from __future__ import annotations

from ihsweep.config import complete
from ihsweep.data.chains import build_bigram, build_synthetic
from ihsweep.steps import _args


@_args.reports_damage
def main(argv: list[str] | None = None) -> int:
    p = _args.parser("chain", "Build the Markov chain of a bigram or synthetic Markov entry.")
    _args.add_spec(p, "--spec", "datasets.<name>.chain")
    p.add_argument("--source-dir", help="bigram chains: the tokenize folder of the source")
    p.add_argument("--out-dir", required=True, help="folder for chain.npy, chain.json, ...")
    p.add_argument("--device", default="cpu", help="torch device of the +D optimisation")
    args = p.parse_args(argv)
    spec = complete("chain", args.spec)
    if spec["kind"] == "bigram":
        if args.source_dir is None:
            p.error("a bigram chain needs --source-dir (the tokenize folder of its source)")
        meta = build_bigram(args.source_dir, spec["vocab_cap"], args.out_dir, spec["drop_eot"])
    else:
        meta = build_synthetic(spec, args.out_dir, args.device)
    m = meta["measured"]
    across = m["across_cos"] if m["across_cos"] is None else round(m["across_cos"], 3)
    print(
        f"{meta['kind']} chain V={meta['vocab_size']}: entropy rate "
        f"{m['entropy_rate_bits']:.3f} bits, KL(sorted) {m['kl_sorted']:.2e}, row max "
        f"{m['mean_row_max']:.3f}, within cos {m['within_cos']:.3f}, across cos {across}, "
        f"{meta['seconds']:.1f} s -> {args.out_dir}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
