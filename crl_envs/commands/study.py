"""``crl-envs study CONFIG``: run a study (resumes), print both tables; ``--dry-run`` prints the plan.

Example::

    crl-envs study studies/paper-small.toml --dry-run    # cells, runs, episodes, model calls, tokens
    crl-envs study studies/paper-small.toml --dry-run --probe   # and each training setting's zero-variance share
    crl-envs study studies/paper-small.toml              # run (or resume), then print study.md
    crl-envs study studies/paper-small.toml --report     # the tables of the cells finished so far
"""

from __future__ import annotations

import argparse

from crl_envs.commands import SUBCOMMANDS

HELP = "run a study config (pools x protocols x tasks, trainers): resumable; prints the paper's tables"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="a study config (.toml), e.g. studies/paper-small.toml")
    p.add_argument("--dry-run", action="store_true", help="print the plan and its cost; run nothing")
    p.add_argument("--report", action="store_true",
                   help="write and print the tables from the cells finished so far; run nothing")
    p.add_argument("--out", default=None, help="output directory (default: the config's [study] out)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--probe", action="store_true",
                   help="with --dry-run: play a short probe per training setting (the untrained learner sampling G "
                        "times on 4 questions) and print its zero-variance share; loads the training pool")


def run(args: argparse.Namespace) -> int:
    from crl_envs import study

    config = study.load_config(args.config, out=args.out)  # every key checked before any work
    planned = study.plan(config)
    print(study.describe_plan(config, planned, probe=args.probe and config.training is not None))
    if args.dry_run:
        return 0
    if args.report:
        study.report(config)
    else:
        study.run(config, progress=not args.quiet)
    print()
    print((config.out / "study.md").read_text())
    print(f"wrote {config.out / 'study.json'}, {config.out / 'study.md'} and the plots in {config.out}")
    return 0


SUBCOMMANDS["study"] = (add_arguments, run, HELP)
