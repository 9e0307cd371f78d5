"""The ``crl-envs`` command line.

Subcommands register themselves in :data:`SUBCOMMANDS` (``name -> (add_arguments, run, help)``), so
each package adds its own (in a module listed in ``_load_plugins``) without touching the others.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

Subcommand = tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int], str]
SUBCOMMANDS: dict[str, Subcommand] = {}


def _add_play(p: argparse.ArgumentParser) -> None:
    p.add_argument("--protocol", default="debate", help="protocol name (default: debate)")
    p.add_argument("--task", default="arith", help="task name (default: arith)")
    p.add_argument("--pool", default="zoo", help="'zoo', 'scripted', or comma-separated agent specs")
    p.add_argument("--n", type=int, default=3, help="number of questions")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="protocol option, e.g. --option rounds=3 (repeatable)")
    p.add_argument("--quiet", action="store_true", help="print only the scores")


def build_pool(spec: str):
    """``zoo`` (the embedded models; the scripted pool while the zoo is not installed), ``scripted``
    (three deterministic experts of accuracy 0.8/0.6/0.4), or comma-separated agent specs."""
    import agents

    if spec == "scripted":
        return agents.pool([agents.ScriptedAgent.expert(f"expert-{a}", a) for a in (0.8, 0.6, 0.4)])
    if spec == "zoo":
        try:
            return agents.pool("zoo")
        except (KeyError, ValueError, FileNotFoundError, ImportError) as e:
            print(f"[crl-envs] zoo unavailable ({e}); using the scripted pool", file=sys.stderr)
            return build_pool("scripted")
    return agents.pool([s.strip() for s in spec.split(",") if s.strip()])


def parse_options(pairs: Sequence[str]) -> dict:
    import json

    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise SystemExit(f"--option expects KEY=VALUE, got {pair!r}")
        key, value = pair.split("=", 1)
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _run_play(args: argparse.Namespace) -> int:
    import numpy as np

    from agents import SamplingParams
    from crl_envs import protocols, run_episodes, tasks
    from crl_envs.runner import total_usage

    factory = protocols.get(args.protocol)
    task = tasks.load(args.task, n=args.n, seed=args.seed)
    pool = build_pool(args.pool)
    sampling = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    episodes = run_episodes(factory, pool, task, seed=args.seed, sampling=sampling,
                            options=parse_options(args.option), progress=not args.quiet)
    for ep in episodes:
        if args.quiet:
            continue
        ex = task.by_id(ep.example_id)
        print(f"=== {ep.example_id}: {ex.question}  (reference {ex.answer})")
        for t in ep.transcript:
            text = t.text.strip().replace("\n", " ")
            print(f"  [{t.phase_name}] {t.agent} ({t.model}): {text}")
        print(f"  -> system answer {ep.answer!r}, score {ep.score:g}")
    usage = total_usage(episodes)
    tokens = sum(u.total_tokens for u in usage.values())
    print(f"{factory(pool, task).metadata['name']} on {task.name} with {pool!r}: "
          f"mean score {np.mean([e.score for e in episodes]):.3f} over {len(episodes)} questions, "
          f"{tokens / len(episodes):.0f} tokens per question")
    return 0


SUBCOMMANDS["play"] = (_add_play, _run_play, "play episodes and print transcripts and scores")


def _load_plugins() -> None:
    """Import the modules that register further subcommands (they may be absent in a partial install)."""
    import importlib

    for module in ("crl_envs.valuation.cli",):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise


def main(argv: Sequence[str] | None = None) -> int:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one bar per loaded model would drown the command's own progress
    _load_plugins()
    parser = argparse.ArgumentParser(prog="crl-envs", description="multi-LLM collaboration environments")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (add_arguments, _run, help_text) in SUBCOMMANDS.items():
        add_arguments(sub.add_parser(name, help=help_text))
    args = parser.parse_args(argv)
    _add, run, _help = SUBCOMMANDS[args.command]
    try:
        return run(args)
    except (ValueError, FileNotFoundError, KeyError) as e:
        print(f"crl-envs {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
