"""Issue #47, ``benchmarks.all`` and the docs' figure check: figures matched as whole numbers with their
unit, a failed run's output and a hand-edited entry rejected, results.json changed under a lock through
a unique temporary name (two ``--only`` runs at once keep both entries; a failed run never replaces a
good one), and the command waits (with a limit) for the machine to settle between benchmarks."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import all as bench  # noqa: E402


def entry(output: str, returncode: int = 0) -> dict:
    return {"command": "python x.py", "what": "x", "returncode": returncode, "wall_s": 1.0, "load_before": 0.1,
            "load_after": 0.2, "loaded": False, "date": "2026-12-05T00:00:00+00:00", "machine": {}, "output": output}


def recorded(name: str, e: dict, tmp_path: Path) -> dict:
    path = tmp_path / "results.json"
    bench.record(name, e, path)
    return bench.read_results(path)[name]


@pytest.mark.parametrize("figure, output, found", [
    ("3 s", "HFAgent: 31.7 s", False),
    ("1.5x", "vLLM is 11.53x faster", False),
    ("42 s", 'File "x.py", line 42, in <module>', False),
    ("31.7 s", "HFAgent: 31.7 s", True),
    ("31.7 s", "HFAgent: 31.7s", True),
    ("1.85x", "ratio 1.85x (vote)", True),
    ("1.85x", "ratio 1.853x", False),
    ("2 s", "2 steps", False),
    ("1,643", "1,643 passed", True),
    ("1,643", "11,643 passed", False),
    ("0.81", "0.815", False),
])
def test_figures_match_whole_numbers_with_their_unit(figure, output, found):
    assert bench.figure_in_output(figure, output) is found


def test_failed_and_hand_edited_runs_back_no_figure(tmp_path):
    good = recorded("cpu_backends", entry("HFAgent: 31.7 s"), tmp_path)
    assert bench.figure_problem("cpu_backends", "31.7 s", good) == ""
    failed = recorded("other", entry('Traceback: File "x.py", line 42 s', returncode=1), tmp_path)
    assert "failed" in bench.figure_problem("other", "42 s", failed)
    edited = {**good, "output": "HFAgent: 3.1 s"}
    assert "edited by hand" in bench.figure_problem("cpu_backends", "3.1 s", edited)


def test_a_failed_run_never_replaces_a_good_entry(tmp_path):
    path = tmp_path / "results.json"
    assert bench.record("cli_startup", entry("wall 0.9 s"), path)
    assert not bench.record("cli_startup", entry("Traceback", returncode=1), path)
    assert bench.read_results(path)["cli_startup"]["output"] == "wall 0.9 s"
    assert bench.record("fresh", entry("Traceback", returncode=1), path)  # nothing good to keep: recorded
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]  # no temporary file left


def test_two_runs_at_once_keep_both_entries(tmp_path):
    """Two processes each recording their own entries many times into one file: every entry survives."""
    path = tmp_path / "results.json"
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from pathlib import Path
        from benchmarks.all import record
        me = sys.argv[1]
        for k in range(40):
            record(f"{{me}}-{{k}}", {{"returncode": 0, "output": str(k), "loaded": False}}, Path({str(path)!r}))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, who]) for who in ("a", "b")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    assert sorted(bench.read_results(path)) == sorted(f"{w}-{k}" for w in "ab" for k in range(40))


def test_it_waits_for_the_machine_to_settle_then_gives_up_at_its_limit():
    readings = iter([0.77, 0.66, 0.58, 0.49, 0.3])
    slept: list[float] = []
    assert bench.settle(0.5, 600, poll_s=5, read_load=lambda: next(readings), sleep=slept.append) == 0.49
    assert slept == [5, 5, 5]
    assert bench.settle(0.5, 0.2, poll_s=0.05, read_load=lambda: 0.9) == 0.9  # the limit: returns, still loaded


def test_every_entry_records_the_load_the_command_started_at(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(bench, "BENCHMARKS", (bench.Benchmark("echo", ("python", "-c", "print('took 1.5 s')"), "quick"),))
    assert bench.main(["--max-load", "1000"]) == 0
    got = bench.read_results(tmp_path / "results.json")["echo"]
    assert got["load_at_start"] >= 0 and got["load_before"] >= 0 and not got["loaded"]
    assert bench.figure_problem("echo", "1.5 s", got) == ""
