"""``crl-envs value``: individual vs compositional strength of a pool's models; prints the table and
writes the report's JSON and PNG.

Example::

    crl-envs value --protocol debate --task arith --pool zoo --estimator loo --out runs/value
    crl-envs value --pool zoo --estimator permutation --budget 200 --ci-level 0.9
    crl-envs value --pool zoo --ray                   # coalitions as Ray tasks (a local cluster)
    crl-envs value --pool zoo --ray head-node:6379    # ... on a running cluster
    crl-envs value --pool zoo4-clones --protocol vote --costs --front 0.02 --interactions 2
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from crl_envs.commands import (
    SUBCOMMANDS,
    add_task_arguments,
    build_pool,
    parse_options,
    positive_int,
    task_options,
    writable_dir,
)
from crl_kit.errors import ConfigError

DEFAULT_QUESTIONS = 200
"""Exact valuation of the 5-model zoo under debate at 50 questions: ~4 CPU-minutes on this 2-core
machine (31 coalitions + 5 individual runs; HF decode steps dominate, so cost grows slowly with n)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from crl_envs.valuation.estimators import ESTIMATORS, estimator_class

    p.add_argument("--protocol", default="debate", help="protocol name (default: debate)")
    p.add_argument("--task", default="arith", help="task name (default: arith)")
    add_task_arguments(p)
    p.add_argument("--pool", default="zoo", help="'zoo', 'scripted', or comma-separated agent specs")
    p.add_argument("--estimator", default="exact", choices=ESTIMATORS,
                   help="; ".join(f"{name}: {estimator_class(name).help}" for name in ESTIMATORS))
    p.add_argument("--budget", type=int, default=None, help="the sampled estimators' budget: permutations (permutation, antithetic) or sampled coalitions (regression)")
    p.add_argument("--ci-level", type=ci_level, default=0.95, metavar="LEVEL",
                   help="level of the bootstrap CIs, a fraction in (0, 1) (default 0.95)")
    p.add_argument("--n", type=int, default=DEFAULT_QUESTIONS, help=f"number of questions (default {DEFAULT_QUESTIONS})")
    p.add_argument("--split", default=None, help="task split (default: the task's own)")
    p.add_argument("--samples", type=int, default=1, help="episodes per question")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--max-new-tokens", type=positive_int, default=None, help="default: the runner's (256)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="protocol option, e.g. --option rounds=3 (repeatable)")
    p.add_argument("--out", default="valuation", help="directory for the JSON and PNG (default: ./valuation)")
    p.add_argument("--cache-dir", default=None, help="coalition cache (default: ~/.cache/crl_envs/valuation)")
    p.add_argument("--no-cache", action="store_true", help="do not read or write the coalition cache")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run coalitions as Ray tasks: on the cluster at ADDRESS ('head:6379', 'ray://head:10001'), "
                        "or with no ADDRESS on $RAY_ADDRESS or a new local cluster (needs: pip install 'crl-envs[ray]')")
    p.add_argument("--costs", action="store_true",
                   help="also print each coalition's cost per question as deployed and the cost-aware values")
    p.add_argument("--cost-lambda", type=float, default=None, metavar="LAMBDA",
                   help="also value the trade-off game v(S) - LAMBDA * (1k tokens of S) per question (implies --costs)")
    p.add_argument("--front", nargs="?", type=float, const=0.02, default=None, metavar="POINTS",
                   help="also print the cost-quality front (accuracy vs tokens and vs seconds) and the cheapest "
                        "coalition within POINTS of the best (a fraction, default 0.02), and write its PNG")
    p.add_argument("--interactions", type=int, default=None, metavar="ORDER",
                   help="also compute interaction indices up to ORDER (1-3) with shapiq, print them and write a "
                        "heatmap (needs: pip install 'crl-envs[interactions]')")
    p.add_argument("--interaction-index", default="SII", help="SII (default), k-SII or Moebius")
    p.add_argument("--interaction-approximator", default=None, metavar="NAME",
                   help="SVARMIQ or KernelSHAPIQ: sampled interactions (pools of more than 12 models)")
    p.add_argument("--interaction-budget", type=int, default=None, metavar="COALITIONS",
                   help="coalitions the approximator may evaluate")


def ci_level(text: str) -> float:
    """``--ci-level``: a fraction in (0, 1); ``95`` is refused with the fraction it meant."""
    try:
        level = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1) such as 0.95, got {text!r}") from None
    if not 0 < level < 1:
        hint = f" ({level / 100:g} for {level:g}%)" if 1 < level < 100 else ""
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1) such as 0.95, got {text}{hint}")
    return level


def check_arguments(args: argparse.Namespace) -> None:
    """The checks that need no model, task or valuation module: they fail before anything loads."""
    if args.n < 1:
        raise ConfigError(f"--n must be >= 1, got {args.n}")
    from crl_envs.valuation.estimators import estimator_class

    estimator_class(args.estimator).check_budget(args.budget, flags=True)
    if args.front is not None and not 0 <= args.front <= 1:
        raise ConfigError(f"--front takes a fraction of accuracy in [0, 1] (0.02 = 2 points), got {args.front}")
    if args.cost_lambda is not None and not args.cost_lambda >= 0:
        raise ConfigError(f"--cost-lambda must be >= 0 (accuracy per 1k tokens, e.g. 0.01), got {args.cost_lambda}")
    if args.interactions is not None:
        from crl_envs.valuation.interactions import check_options

        # the pool's size is not known yet: what does not depend on it
        check_options(None, args.interaction_index, args.interactions, args.interaction_approximator,
                      args.interaction_budget)
    elif args.interaction_approximator or args.interaction_budget is not None:
        raise ConfigError("--interaction-approximator/--interaction-budget need --interactions ORDER")
    writable_dir(args.out)


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    check_arguments(args)
    from agents import SamplingParams
    from crl_envs import tasks
    from crl_envs.runner import DEFAULT_SAMPLING
    from crl_envs.valuation import RayExecutor, evaluate

    task = tasks.load(args.task, split=args.split, n=args.n, seed=args.seed, **task_options(args))
    pool = build_pool(args.pool)
    sampling = SamplingParams(temperature=args.temperature,
                              max_new_tokens=args.max_new_tokens or DEFAULT_SAMPLING.max_new_tokens)
    report = evaluate(
        args.protocol, pool, task, estimator=args.estimator, budget=args.budget, samples=args.samples,
        seed=args.seed, ci_level=args.ci_level, sampling=sampling, options=parse_options(args.option),
        cache_dir=False if args.no_cache else args.cache_dir, progress=not args.quiet,
        executor="local" if args.ray is None else RayExecutor(args.ray or None),
        cost_lambda=args.cost_lambda, interactions=args.interactions, interaction_index=args.interaction_index,
        interaction_approximator=args.interaction_approximator, interaction_budget=args.interaction_budget,
    )
    print(report)  # its last section: the cross-fit verdict per measure (report.verdicts(), as the study's)
    out = Path(args.out)
    stem = f"{report.protocol}-{report.task}-{args.estimator}"
    png_path = report.plot(out / f"{stem}.png")
    extra = print_cost_sections(report, args, out / stem)
    json_path = write_json(report, args, out / f"{stem}.json")
    print(f"\nwrote {json_path} and {png_path}" + "".join(f", {p}" for p in extra))
    print(f"{time.perf_counter() - started:.0f} s wall")  # what README's "about N minutes" is checked against
    return 0


def write_json(report, args: argparse.Namespace, path: Path) -> Path:
    """The report's JSON (:meth:`ValuationReport.to_dict`: the tables, CIs, and under ``crossfit`` the verdict
    per measure with its cross-fit statistic, alpha = 1 - ``--ci-level``), with the front when ``--front``
    asked for it (interactions, when asked, are part of the report)."""
    from crl_kit.safe_io import atomic_write_json

    d = report.to_dict()
    if args.front is not None:
        d["front"] = report.front().to_dict(within=args.front)
    atomic_write_json(path, d, indent=1)
    return path


def print_cost_sections(report, args: argparse.Namespace, stem: Path) -> list[Path]:
    """The sections ``--costs``, ``--cost-lambda``, ``--front`` and ``--interactions`` ask for; returns
    the figures written."""
    written = []
    if args.costs or args.cost_lambda is not None:
        print("\n" + report.cost_table())
    if args.front is not None:
        front = report.front()
        for cost in ("tokens", "seconds"):
            print("\n" + front.table(cost, within=args.front))
        written.append(front.plot(f"{stem}-front-tokens.png", "tokens",
                                  title=f"{report.protocol} on {report.task}: accuracy vs tokens"))
    if report.interactions is not None:
        print("\n" + report.interactions.table(report.names, top=10))
        written.append(report.interactions.plot(f"{stem}-interactions.png", report.names,
                                                title=f"{report.protocol} on {report.task}"))
    return written


SUBCOMMANDS["value"] = (add_arguments, run, "value a pool's models: individual vs LOO/Shapley/Banzhaf, table + JSON + PNG")
