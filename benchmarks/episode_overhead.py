"""What an episode costs outside the models: ``study.plan("studies/paper-small.toml")`` (the dry run's cost
estimate plays ~82,000 stand-in episodes through the runner) with the per-episode shortcuts and without them.

The shortcuts (each keeps its result; tests/test_episode_overhead.py checks them against what they replace):

- a :class:`crl_envs.spaces.TextSpace` built from charset tables made once, not per space (~40 us each; an env
  builds one per agent and episode);
- ``SamplingParams.with_seed`` copying the checked fields instead of ``dataclasses.replace`` checking them again
  (once per request);
- the request key's JSON built from the sampling fields without ``dataclasses.asdict``'s deep copy;
- the answer extraction cached per (text, finish reason) (every seat and coalition that shows an answer reads it);
- a named zoo pool's size read from the registry, not by loading its models (the plan asked 98 times).

``--mode before`` puts the replaced code back for the run (in its own process), ``--mode after`` runs what the
library does now; without ``--mode`` the script runs both ``--repeats`` times, alternating, and prints the medians
and the ratio. The load average is printed beside the seconds: run it on an idle machine.

    python benchmarks/episode_overhead.py [--repeats 3] [--study studies/paper-small.toml]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def restore_replaced_code() -> None:
    """The code the shortcuts replaced, put back (for ``--mode before``)."""
    import hashlib

    from gymnasium import spaces

    import agents
    import crl_envs.runner
    import crl_envs.spaces
    from crl_envs.tasks import numeric

    def text_space_init(self, max_length, *, seed=None):
        spaces.Text.__init__(self, max_length=max_length, min_length=0, charset=crl_envs.spaces.SAMPLE_CHARSET,
                             seed=seed)

    def key(fingerprint, messages, sampling):
        payload = json.dumps([fingerprint, messages, dataclasses.asdict(sampling)], sort_keys=True, ensure_ascii=False)
        return hashlib.blake2b(payload.encode(), digest_size=16).hexdigest()

    crl_envs.spaces.TextSpace.__init__ = text_space_init
    agents.SamplingParams.with_seed = lambda self, seed: dataclasses.replace(self, seed=seed)
    crl_envs.runner._key = key
    numeric._extract_number = numeric._extract_number.__wrapped__
    agents.pool_size = lambda name: len(agents.pool(name))


def one_run(mode: str, study_path: str) -> dict[str, float]:
    if mode == "before":
        restore_replaced_code()
    from crl_envs import study

    load = os.getloadavg()[0]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        cells = study.plan(study_path, out=out)
    return {"seconds": time.perf_counter() - start, "cells": len(cells), "load": load}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=["before", "after"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--study", default="studies/paper-small.toml")
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(one_run(args.mode, args.study)))
        return
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for _ in range(args.repeats):
        for mode in runs:
            done = subprocess.run([sys.executable, __file__, "--mode", mode, "--study", args.study], cwd=ROOT,
                                  check=True, capture_output=True, text=True)
            runs[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
            r = runs[mode][-1]
            print(f"{mode:>6}: plan of {args.study} ({r['cells']:.0f} cells) {r['seconds']:.1f} s, load average "
                  f"{r['load']:.2f}", flush=True)
    before, after = (statistics.median(r["seconds"] for r in runs[m]) for m in ("before", "after"))
    print(f"median of {args.repeats}: before {before:.1f} s, after {after:.1f} s: {before / after:.2f}x faster; "
          f"load average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
