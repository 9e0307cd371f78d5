"""Time the code sandbox on HumanEval: all 164 canonical solutions, then each with ``return None``.

Usage: ``python benchmarks/sandbox_humaneval.py [--workers 2]``. Prints wall time, programs per
second and pass counts (expected: 164/164 canonical pass, 0/164 stubs pass).
"""

from __future__ import annotations

import argparse
import time

from crl_envs import sandbox, tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    task = tasks.load("humaneval")
    print(f"isolation: {' '.join(sandbox.isolation()) or 'none (audit hook and limits only)'}")
    for label, completion in (("canonical", None), ("return None", "    return None\n")):
        programs = [task.program(completion or e.answer, e) for e in task]
        start = time.perf_counter()
        results = sandbox.run_many(programs, workers=args.workers, timeout=task.timeout, progress=True)
        seconds = time.perf_counter() - start
        passed = sum(r.passed for r in results)
        print(f"{label:>12}: {passed}/{len(results)} pass; {seconds:.1f} s on {args.workers} workers "
              f"({len(results) / seconds:.1f} programs/s, {seconds / len(results) * args.workers * 1000:.0f} ms "
              f"per program per worker)")


if __name__ == "__main__":
    main()
