"""Time the code sandbox on HumanEval: 164 canonical solutions, then each with ``return None``.

Usage: ``python benchmarks/sandbox_humaneval.py [--workers 2] [--before REV]``.

"after" is the current scorer (``HumanEvalTask.score_many``: program and checker in two bwrap
sandboxes, verdict by the checker, each sandbox in its own cgroup with the seccomp filter where this
machine has them). With ``--before REV`` (default ``13ab484``, the last commit with the sandbox as one
file, before seccomp, cgroups and reaping) the old ``crl_envs/sandbox.py`` is read from git, loaded
from a temp file and timed side by side on the same programs and tests (a revision without
``run_tests``, such as ``cba63d9``, the single-process sandbox, runs the old single-program harness);
the ratio is printed.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from crl_envs import sandbox, tasks

ROOT = Path(__file__).resolve().parents[1]


def load_old_sandbox(rev: str):
    source = subprocess.run(["git", "show", f"{rev}:crl_envs/sandbox.py"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout
    path = Path(tempfile.mkdtemp(prefix="crl-old-sandbox-")) / "sandbox_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("sandbox_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["sandbox_before"] = module
    spec.loader.exec_module(module)
    return module


def old_program(task, code: str, example) -> str:
    """The pre-change harness: prompt, completion, tests and ``check(entry)`` in one program."""
    program, _ = task.harness(code, example)
    return f"{program}\n\n{example.metadata['test']}\n\ncheck({example.metadata['entry_point']})\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--before", default="13ab484", help="git revision of the old sandbox ('' to skip)")
    args = parser.parse_args()
    task = tasks.load("humaneval")
    examples = list(task)
    old = load_old_sandbox(args.before) if args.before else None
    print(f"after: {sandbox.isolation()}")
    if old is not None:
        described = old.isolation()
        described = described if isinstance(described, str) else " ".join(described)
        print(f"before ({args.before}): {described or 'no namespaces'}")
    for label, completion in (("canonical", None), ("return None", "    return None\n")):
        codes = [completion or e.answer for e in examples]
        per_program = {}
        if old is not None:
            start = time.perf_counter()
            if hasattr(old, "run_tests"):
                runs = [task.harness(c, e) for c, e in zip(codes, examples)]
                results = old.run_many([p for p, _ in runs], tests=[t for _, t in runs], workers=args.workers,
                                       timeout=task.timeout)
            else:
                results = old.run_many([old_program(task, c, e) for c, e in zip(codes, examples)],
                                       workers=args.workers, timeout=task.timeout)
            seconds = time.perf_counter() - start
            per_program["before"] = seconds / len(examples) * args.workers
            print(f"{label:>12} before: {sum(r.passed for r in results)}/{len(results)} pass, {seconds:.1f} s, "
                  f"{per_program['before'] * 1000:.0f} ms per program per worker")
        task._cache.clear()
        start = time.perf_counter()
        scores = task.score_many(codes, examples, workers=args.workers)
        seconds = time.perf_counter() - start
        per_program["after"] = seconds / len(examples) * args.workers
        print(f"{label:>12}  after: {int(sum(scores))}/{len(scores)} pass, {seconds:.1f} s, "
              f"{per_program['after'] * 1000:.0f} ms per program per worker")
        if old is not None:
            print(f"{label:>12}  after/before: {per_program['after'] / per_program['before']:.2f}x")


if __name__ == "__main__":
    main()
