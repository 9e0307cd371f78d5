"""Which model should I add to / drop from my system, and does my benchmark ranking predict that?

Values every model of a pool inside two protocols (individual strength vs leave-one-out, Shapley and
Banzhaf compositional strength), prints the tables, saves the figures, then pools the settings in a
stratified permutation test of "individual strength predicts compositional strength".

    python examples/valuation.py                 # the embedded zoo (or scripted experts without it)
    python examples/valuation.py --pool scripted --n 100 --out runs/valuation

Coalition results are cached (``~/.cache/crl_envs/valuation``): a second run recomputes nothing, and
an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from crl_envs import tasks, valuation
from crl_envs.commands import build_pool


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", default="zoo", help="'zoo', 'scripted' or comma-separated agent specs")
    parser.add_argument("--task", default="arith")
    parser.add_argument("--protocols", default="vote,debate", help="comma-separated protocol names")
    parser.add_argument("--n", type=int, default=50, help="questions")
    parser.add_argument("--out", default="valuation-example", help="where the JSON and PNG files go")
    args = parser.parse_args()

    pool = build_pool(args.pool)
    task = tasks.load(args.task, n=args.n)
    out = Path(args.out)
    reports = []
    for protocol in args.protocols.split(","):
        report = valuation.evaluate(protocol, pool, task)  # exact: 2^n - 1 coalitions, cached on disk
        print(report, end="\n\n")
        report.to_json(out / f"{protocol}.json")
        print(f"figure: {report.plot(out / f'{protocol}.png')}\n")
        reports.append(report)

    # One pool of 3-4 models can never reach significance on its own (smallest two-sided p-value:
    # 1/3 with 3 models, 1/12 with 4); pooling settings is the honest test.
    print(valuation.pooled_test(reports, measure="shapley"))
    print(valuation.pooled_test(reports, measure="loo"))


if __name__ == "__main__":
    main()
