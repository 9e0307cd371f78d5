"""Blind baselines of the eight procedural tasks: always give the most common *train* answer, scored on
300 test questions (pyfunc's program runs its held-out asserts in the sandbox); with each task's chance
level. A task the format alone solves would teach nothing; these are the floors docs/zoo.md reports.

    nice python benchmarks/procedural_baselines.py
"""

from __future__ import annotations

from agents.zoo.specs import TASKS3
from crl_envs import tasks
from crl_envs.tasks.procedural import TASK_KINDS


def main() -> None:
    print("| kind | task | majority answer | majority (test) | chance |")
    print("|---|---|---|---|---|")
    for kind, names in TASK_KINDS.items():
        for name in names:
            b = tasks.majority_baseline(tasks.load, name, n_test=300, **TASKS3[name])
            answer = b["majority_answer"].replace("\n", "\\n")
            print(f"| {kind} | {name} | `{answer}` | {b['majority']:.3f} | {b['chance']:.3f} |")


if __name__ == "__main__":
    main()
