"""Issue #47, the study's small checks: [valuation.families] labels that cannot break study.md, executor
workers refused where they do nothing, max_new_tokens bounded, and with two drivers each one's "N run now"
counts only the cells it ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from crl_envs import study
from crl_envs.study import StudyConfigError, load_config

REPO = Path(__file__).resolve().parents[1]


def small_config(out: Path, **changes) -> dict:
    config = {"study": {"name": "small", "out": str(out)},
              "pools": {"two": [{"expert": 0.8}, {"expert": 0.5}]},
              "tasks": {"arith": {"n": 6}},
              "protocols": {"vote": {}, "debate": {}},
              "valuation": {"bootstrap_resamples": 20}}
    config.update(changes)
    return config


@pytest.mark.parametrize("label", ["a|b", "api\nrow", ""])
def test_family_labels_that_would_break_the_report_are_refused(tmp_path, label):
    config = small_config(tmp_path, valuation={"families": {label: ["vote", "debate"]}})
    with pytest.raises(StudyConfigError, match="valuation.families.*family label") as e:
        load_config(config)
    assert "\n" not in str(e.value)


def test_executor_workers_are_refused_where_they_do_nothing(tmp_path):
    for kind in ("local", "ray"):
        with pytest.raises(StudyConfigError, match=r'executor.workers: only applies to kind = "processes"') as e:
            load_config(small_config(tmp_path, executor={"kind": kind, "workers": 4}))
        assert "\n" not in str(e.value)
    assert load_config(small_config(tmp_path, executor={"kind": "processes", "workers": 4})).executor.workers == 4


@pytest.mark.parametrize("where", ["sampling", "task"])
def test_max_new_tokens_is_bounded(tmp_path, where):
    def config(value: int) -> dict:
        if where == "sampling":
            return small_config(tmp_path, sampling={"max_new_tokens": value})
        return small_config(tmp_path, tasks={"arith": {"n": 6, "max_new_tokens": value}})

    with pytest.raises(StudyConfigError, match="max_new_tokens: must be at most 65,536"):
        load_config(config(2**63 - 1))
    load_config(config(65_536))


HOLDER = """
import json, sys
from crl_envs import study
from crl_envs.study import runner
config = study.load_config(json.loads(sys.argv[1]))
cell = study.plan(config)[0]
assert runner._claim(config.out, cell)
print("held", flush=True)
sys.stdin.readline()
runner.run_cells(config, [cell], progress=False)  # this driver runs the cell it holds
runner._release(config.out, cell)
print("released", flush=True)
"""


@pytest.mark.timeout(240)
def test_with_two_drivers_each_counts_only_the_cells_it_ran(tmp_path):
    config = small_config(tmp_path / "out")
    assert len(study.plan(load_config(config))) == 2
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, json.dumps(config)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    got: dict = {}
    try:
        assert holder.stdout.readline().strip() == "held"
        driver = threading.Thread(target=lambda: got.update(study.run(config, progress=False)))
        driver.start()
        time.sleep(3)  # the driver runs the other cell and waits for the held one
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "released"
        driver.join(timeout=180)
        assert not driver.is_alive()
    finally:
        holder.kill()
        holder.wait()
    assert (got["run"]["executed"], got["run"]["cached"]) == (1, 1)
    assert "Cells: 2 (1 run now, 1 from earlier runs)" in (tmp_path / "out" / "study.md").read_text()
