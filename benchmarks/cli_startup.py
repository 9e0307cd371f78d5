"""How long ``crl-envs --help`` and a mistyped command take, next to a bare ``python -c pass`` and to
what the CLI imported before it loaded lazily (transformers + the whole package).

Prints the median wall time of each over ``--repeats`` runs, and the ratio to a bare interpreter
(busy cores slow all of them alike; the ratio travels across machines better than the seconds).

    python benchmarks/cli_startup.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path


def wall(cmd: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


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
    for label, cmd in cases.items():
        seconds = wall(cmd, args.repeats)
        base = base or seconds
        print(f"{label:52s} {seconds:6.2f} s   {seconds / base:5.1f}x python -c pass")


if __name__ == "__main__":
    main()
