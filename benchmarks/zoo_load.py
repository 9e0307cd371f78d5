"""Time to load the embedded zoo (``agents.pool("zoo")``) in a fresh process, and its size on disk.

    python benchmarks/zoo_load.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

CODE = "import time; t0 = time.perf_counter(); import agents; agents.pool('zoo'); print(time.perf_counter() - t0)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    times = []
    for _ in range(args.repeats):
        out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True,
                             env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
        times.append(float(out.stdout.strip().splitlines()[-1]))
    import agents.zoo

    size = sum(f.stat().st_size for f in agents.zoo.MODELS_DIR.rglob("*") if f.is_file())
    print(f"zoo load (import agents + 5 models, fresh process): median {statistics.median(times):.2f} s "
          f"over {args.repeats} (min {min(times):.2f}, max {max(times):.2f}); files {size / 2**20:.2f} MB")


if __name__ == "__main__":
    main()
