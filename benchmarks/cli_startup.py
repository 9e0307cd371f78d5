"""How long ``crl-envs --help``, each subcommand's ``--help`` and a mistyped command or option take, next
to a bare ``python -c pass`` and to what the CLI imported before it loaded lazily (transformers + the
whole package; for ``value --help``, torch and scipy through ``crl_envs.valuation``).

Prints the median wall time and CPU time (user + system) of each over ``--repeats`` runs, the
wall-time ratio to a bare interpreter (busy cores slow all of them alike; CPU time and the ratio
travel across machines better than the wall seconds), and ``value --help`` over ``play --help``.

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
    cli = [str(script)] if script.exists() else [sys.executable, "-m", "crl_envs.commands"]
    cases = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "crl-envs --help": [*cli, "--help"],
        "crl-envs vaule (typo)": [*cli, "vaule"],
        "crl-envs play --help": [*cli, "play", "--help"],
        "crl-envs value --help": [*cli, "value", "--help"],
        "crl-envs play --temprature 1 (option typo)": [*cli, "play", "--temprature", "1"],
        "before: import transformers + the valuation modules": [
            sys.executable, "-c", "import transformers.utils.logging, crl_envs.runner, crl_envs.valuation.game, "
            "crl_envs.valuation.pooled"],
    }
    wall: dict[str, float] = {}
    print(f"{'':52s} {'wall':>7s} {'CPU':>7s}   wall / python -c pass   (load average {os.getloadavg()[0]:.1f})")
    for label, cmd in cases.items():
        seconds, cpu = measure(cmd, args.repeats)
        wall[label] = seconds
        print(f"{label:52s} {seconds:6.2f}s {cpu:6.2f}s   {seconds / wall['python -c pass']:5.1f}x")
    print(f"value --help / play --help: {wall['crl-envs value --help'] / wall['crl-envs play --help']:.2f}x wall")


if __name__ == "__main__":
    main()
