"""How long ``crl-envs --help`` and a mistyped command take, next to a bare ``python -c pass`` and to
what the CLI imported before it loaded lazily (transformers + the whole package).

Prints the median wall time and CPU time (user + system) of each over ``--repeats`` runs, and the
wall-time ratio to a bare interpreter (busy cores slow all of them alike; CPU time and the ratio
travel across machines better than the wall seconds).

    python benchmarks/cli_startup.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path


def measure(cmd: list[str], repeats: int) -> tuple[float, float]:
    """Median wall seconds and median CPU seconds (user + system, the child's) of ``cmd``."""
    walls, cpus = [], []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        walls.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    script = Path(sysconfig.get_path("scripts")) / "crl-envs"
    cli = [str(script)] if script.exists() else [sys.executable, "-m", "crl_envs.cli"]
    cases = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "crl-envs --help": [*cli, "--help"],
        "crl-envs vaule (typo)": [*cli, "vaule"],
        "crl-envs play --help": [*cli, "play", "--help"],
        "before: import transformers + crl_envs.valuation": [
            sys.executable, "-c", "import transformers.utils.logging, crl_envs.valuation, crl_envs.runner"],
    }
    base = None
    print(f"{'':52s} {'wall':>7s} {'CPU':>7s}   wall / python -c pass   (load average {os.getloadavg()[0]:.1f})")
    for label, cmd in cases.items():
        seconds, cpu = measure(cmd, args.repeats)
        base = base or seconds
        print(f"{label:52s} {seconds:6.2f}s {cpu:6.2f}s   {seconds / base:5.1f}x")


if __name__ == "__main__":
    main()
