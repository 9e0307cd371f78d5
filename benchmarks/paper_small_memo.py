"""The request memo on ``studies/paper-small.toml``: wall time and model calls from an empty output
directory, before (``memo=False``: every request generated, one coalition at a time) and after (the
default: each distinct request generated once, coalitions in lockstep).

Each run is a fresh process (no memo or model carried over), from an empty output directory, on the
local executor. By default only the valuation half runs (the memo is a valuation feature: training
cells make no valuation calls); ``--whole`` times the whole study after, and ``--whole-before`` the whole
study before too. The script checks that both runs' valuation results are identical and prints the
dry-run estimate of the calls beside the calls made, with ``uptime``'s load average beside every wall
time. Run it alone on an idle machine.

Usage:
    python benchmarks/paper_small_memo.py                 # valuation half, before and after
    python benchmarks/paper_small_memo.py --whole         # ... and the whole study after
    python benchmarks/paper_small_memo.py --after-only    # valuation half with the memo only: its wall
                                                          # time and the dry-run estimate vs calls made
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "studies" / "paper-small.toml"


def _config(whole: bool, out: Path) -> dict:
    config = tomllib.loads(CONFIG.read_text())
    config["study"]["out"] = str(out)
    if not whole:
        config.pop("training", None)
    return config


def one(mode: str, whole: bool, out: Path) -> dict:
    """Run the study once in this process; returns wall seconds, generations and the valuation settings."""
    from agents import ScriptedAgent
    from agents.base import Agent
    from crl_envs import study, valuation

    generated = [0]
    original = Agent.generate

    def counting(self, requests):  # the pools' models only: not the plan's scripted stand-ins (the estimate)
        result = original(self, requests)
        if not isinstance(self, ScriptedAgent):
            generated[0] += len(result)
        return result

    Agent.generate = counting
    by_members: dict[tuple[str, ...], int] = {}  # generations of each pool's valuation cells
    evaluate = valuation.evaluate

    def counted(protocol, pool, *args, **kwargs):
        start = generated[0]
        report = evaluate(protocol, pool, *args, **({**kwargs, "memo": False} if mode == "before" else kwargs))
        by_members[tuple(pool.names)] = by_members.get(tuple(pool.names), 0) + generated[0] - start
        return report

    valuation.evaluate = counted
    config = _config(whole, out)
    planned = study.plan(config)
    estimate = sum(c.cost["calls"] for c in planned if c.kind == "valuation")
    t0 = time.perf_counter()
    result = study.run(config, progress=False)
    seconds = time.perf_counter() - t0
    settings = result["valuation"]["settings"]
    per_pool = {}  # pool label -> [estimated, generated] over its valuation cells
    for c in planned:
        if c.kind == "valuation":
            label = c.id.split("/")[1]
            per_pool.setdefault(label, [0.0, 0])[0] += c.cost["calls"]
    label_of = {tuple(s["models"]): s["pool"] for s in settings}
    for members, made in by_members.items():
        per_pool[label_of[members]][1] = made
    cells = {k: v["seconds"] for k, v in result["cells"].items()}
    return {"mode": mode, "seconds": seconds, "generated": generated[0], "estimate": estimate,
            "load": os.getloadavg(), "settings": settings, "per_pool": per_pool, "cells": cells}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--whole", action="store_true", help="also time the whole study (training too) after")
    parser.add_argument("--whole-before", action="store_true", help="time the whole study before too")
    parser.add_argument("--after-only", action="store_true",
                        help="only the valuation half with the memo (the estimate against the calls made)")
    parser.add_argument("--one", choices=["before", "after"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--whole-one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one, args.whole_one, args.out)))
        return 0
    runs = [("after", False)] if args.after_only else [("before", False), ("after", False)]
    if args.whole_before:
        runs.append(("before", True))
    if args.whole or args.whole_before:
        runs.append(("after", True))
    measured = {}
    for mode, whole in runs:
        with tempfile.TemporaryDirectory(prefix="paper-small-") as tmp:
            command = [sys.executable, __file__, "--one", mode, "--out", tmp] + (["--whole-one"] if whole else [])
            done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
            if done.returncode:
                sys.stderr.write(done.stderr)
                return done.returncode
            r = json.loads(done.stdout.strip().splitlines()[-1])
        measured[mode, whole] = r
        part = "whole study" if whole else "valuation half"
        print(f"{part:15s} {mode:6s}: {r['seconds']:7.1f} s wall, {r['generated']:>9,} generations "
              f"(dry-run estimate of valuation calls {r['estimate']:,.0f}), load at the end "
              f"{r['load'][0]:.2f} {r['load'][1]:.2f} {r['load'][2]:.2f}", flush=True)
        for label, (estimated, made) in r["per_pool"].items():
            print(f"  pool {label:12s}: {made:>9,} generations, dry-run estimate {estimated:>9,.0f} "
                  f"({estimated / max(made, 1) - 1:+.1%})", flush=True)
        if whole:
            kinds: dict[str, float] = {}
            for cell, seconds in r["cells"].items():
                kinds[cell.split("/")[0]] = kinds.get(cell.split("/")[0], 0.0) + seconds
            print("  cell seconds by kind: " + ", ".join(f"{k} {v:,.0f} s" for k, v in sorted(kinds.items())),
                  flush=True)
    after = measured["after", False]
    estimate = f"dry-run estimate {after['estimate'] / max(after['generated'], 1) - 1:+.1%} of the calls made"
    if args.after_only:
        print(f"valuation half: {estimate}")
        return 0
    before = measured["before", False]
    same = json.dumps(before["settings"], sort_keys=True) == json.dumps(after["settings"], sort_keys=True)
    print(f"valuation half: {before['seconds'] / after['seconds']:.2f}x faster, "
          f"{before['generated'] / max(after['generated'], 1):.2f}x fewer generations; "
          f"{estimate}; results identical: {same}")
    if ("before", True) in measured:
        print(f"whole study: {measured['before', True]['seconds'] / measured['after', True]['seconds']:.2f}x faster")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
