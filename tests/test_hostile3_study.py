"""Issue #37, the study and the CLI: cell fingerprints cover the task's content, cell files validated on
read, injective cell ids, flock locks that name their holder and cover every cell kind, plans refused
above a stated size without being built, config errors caught at load (a passing dry-run means the run
will not fail on its config), reports and logs never written through a link, names escaped in the
report, and the CLI's small checks (task option types, --max-new-tokens 0, an unwritable --out)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from crl_envs import study
from crl_envs.commands import main
from crl_envs.study import StudyConfigError, load_config, runner

REPO = Path(__file__).resolve().parents[1]


def small_config(out: Path, **changes) -> dict:
    config = {"study": {"name": "small", "out": str(out)},
              "pools": {"two": [{"expert": 0.8}, {"expert": 0.5}]},
              "tasks": {"arith": {"n": 6}},
              "protocols": {"vote": {}},
              "valuation": {"bootstrap_resamples": 20}}
    config.update(changes)
    return config


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write_gsm8k(path: Path, k: int) -> None:
    rows = [{"question": f"Ann has {i} pens and gets {i + 2} more. How many?", "answer": f"#### {2 * i + 2}"}
            for i in range(k)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


# ---------------------------------------------------------------------- item 3: content in fingerprints
def test_resumed_study_reruns_a_cell_whose_data_file_changed(tmp_path):
    data = tmp_path / "g.jsonl"
    write_gsm8k(data, 4)
    config = small_config(tmp_path / "out", tasks={"g": {"name": "gsm8k", "options": {"path": str(data)}}})
    first = study.run(config, progress=False)
    assert first["valuation"]["settings"][0]["questions"] == 4
    write_gsm8k(data, 12)  # the same path, other questions
    again = study.run(config, progress=False)
    assert again["run"]["executed"] == 1  # not "0 run now"
    assert again["valuation"]["settings"][0]["questions"] == 12
    assert study.run(config, progress=False)["run"]["executed"] == 0  # unchanged data: reused


# ---------------------------------------------------------------------- item 4: cell files validated on read
@pytest.mark.parametrize("garbage", ["[]", "{}", "not json", "tamper-score", "tamper-length"])
def test_a_bad_cell_file_is_recomputed_with_a_warning_naming_it(garbage, tmp_path, capsys):
    config = small_config(tmp_path / "out")
    first = study.run(config, progress=False)
    (cell,) = study.plan(config)
    path = tmp_path / "out" / "cells" / f"{cell.fingerprint}.json"
    good = json.loads(path.read_text())
    if garbage == "tamper-score":
        good["report"]["system"][0] = 7.5
        text = json.dumps(good)
    elif garbage == "tamper-length":
        good["report"]["measures"]["individual"]["per_question"][0].pop()
        text = json.dumps(good)
    else:
        text = garbage
    path.write_text(text)
    with pytest.warns(UserWarning, match=f"study cell file {path} is not a valid result of {cell.id}"):
        code, out, _ = cli(capsys, "study", _toml(tmp_path, config), "--dry-run")
    assert code == 0 and "| valuation | 1 | 0 |" in out  # the cell is pending again, not a crash
    with pytest.warns(UserWarning, match="the cell runs again"):
        again = study.run(config, progress=False)
    assert again["run"]["executed"] == 1
    assert again["valuation"] == first["valuation"]
    assert runner.load_result(tmp_path / "out", cell) is not None  # the file was replaced by a valid one


def _toml(tmp_path: Path, config: dict) -> str:
    """``config`` as a TOML file (only the shapes these tests use)."""
    def value(v):
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + "}"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return json.dumps(v)

    lines = []
    for section, body in config.items():
        lines.append(f"[{section}]")
        lines += [f"{json.dumps(k)} = {value(v)}" for k, v in body.items()]
    path = tmp_path / "cfg.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


# ---------------------------------------------------------------------- item 5: injective cell ids
def slash_config(out: Path) -> dict:
    """Protocol ``vote/a`` with task ``arith`` and protocol ``vote`` with task ``a/arith``: one cell id."""
    return small_config(out, tasks={"arith": {"n": 4}, "a/arith": {"name": "arith", "n": 4}},
                        protocols={"vote/a": {"protocol": "vote"}, "vote": {}})


def test_labels_with_a_slash_are_refused_at_load(tmp_path):
    with pytest.raises(StudyConfigError, match=r"^study config: tasks\.'a/arith': a task label is 1 to 64 letters"):
        load_config(slash_config(tmp_path / "out"))
    config = slash_config(tmp_path / "out")
    del config["tasks"]["a/arith"]
    with pytest.raises(StudyConfigError, match=r"^study config: protocols\.'vote/a': a protocol label is"):
        load_config(config)


@pytest.mark.slow
def test_labels_with_a_slash_are_refused_under_python_O(tmp_path):
    """Not an assert: ``python -O`` refuses them too (it used to mix the two cells' results)."""
    config = slash_config(tmp_path / "out")
    code = ("import sys; from crl_envs import study\n"
            f"try: study.plan({config!r})\n"
            "except study.StudyConfigError as e: print(e); sys.exit(3)\n")
    done = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert done.returncode == 3, done.stderr[-2000:]
    assert "a task label is" in done.stdout


# ---------------------------------------------------------------------- item 7: locks
def test_a_lock_file_left_behind_does_not_block_a_cell(tmp_path):
    """A lock file is only a name: the lock is a flock, so a pid left in it (pid 1, alive) or an empty
    file (a driver killed between create and write) blocks nothing."""
    config = load_config(small_config(tmp_path / "out"))
    (cell,) = study.plan(config)
    lock = tmp_path / "out" / "cells" / f"{cell.fingerprint}.lock"
    lock.parent.mkdir(parents=True)
    for left in ("1", ""):
        lock.write_text(left)
        assert runner._claim(config.out, cell)
        runner._release(config.out, cell)
    lock.write_text("1")
    result = study.run(config, progress=False)  # waited forever before
    assert result["run"]["executed"] == 1


HOLDER = """
import json, sys
from crl_envs import study
from crl_envs.study import runner
from crl_envs.valuation.coalition import atomic_write_json
config = study.load_config(json.loads(sys.argv[1]))
planned = study.plan(config)
assert all(runner._claim(config.out, c) for c in planned)
print("held", flush=True)
if sys.stdin.readline().strip() == "finish":
    for c in planned:
        atomic_write_json(runner.cell_path(config.out, c), {
            "id": c.id, "kind": c.kind, "fingerprint": c.fingerprint, "example_ids": ["a", "b"],
            "system": [1.0, 0.0], "standalone": [0.0, 0.0], "without_learner": [1.0, 0.0], "rollouts": 0,
            "summary": "by the holder"})  # a baseline carries the system without the learner (#46)
    for c in planned:
        runner._release(config.out, c)
    print("released", flush=True)
    sys.stdin.readline()
"""


def _holder(config: dict) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, json.dumps(config)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_held_lock_names_its_holder_and_dies_with_it(tmp_path):
    config = small_config(tmp_path / "out")
    holder = _holder(config)
    try:
        loaded = load_config(config)
        (cell,) = study.plan(loaded)
        assert not runner._claim(loaded.out, cell)
        who = runner.lock_holder(loaded.out, cell)
        assert who.startswith(f"pid {holder.pid} on host ") and " since " in who
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert runner._claim(loaded.out, cell)  # the kernel released it with its holder
    runner._release(loaded.out, cell)


@pytest.mark.timeout(240)
def test_processes_executor_claims_baseline_and_training_cells(tmp_path, capsys):
    """Under kind = "processes", whole cells (baseline, training) are claimed too: while another driver
    holds them this one waits, says who holds them, and takes their results when they are written."""
    config = small_config(tmp_path / "out", executor={"kind": "processes", "workers": 1},
                          training={"pool": "zoo", "learner": "model_4", "trainers": ["crl", "grpo"],
                                    "setups": {"vote": {}}, "tasks": ["arith"], "n_train": 4, "n_eval": 2,
                                    "steps": 1})
    del config["valuation"]
    config["pools"]["zoo"] = "zoo"  # a trainable learner (a scripted one is refused at load); the holder runs nothing
    holder = _holder(config)
    loaded = load_config(config)
    planned = study.plan(loaded)
    assert {c.kind for c in planned} == {"baseline", "training"}
    got: dict = {}
    driver = threading.Thread(target=lambda: got.update(runner.run_cells(loaded, planned, progress=False)))
    try:
        driver.start()
        time.sleep(4)
        assert driver.is_alive() and not (tmp_path / "out" / "logs").exists()  # nothing run under the lock
        holder.stdin.write("finish\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "released"
        driver.join(timeout=120)
        assert not driver.is_alive()
    finally:
        holder.kill()
        holder.wait()
    assert {r["summary"] for r in got.values()} == {"by the holder"} and len(got) == len(planned)
    assert not (tmp_path / "out" / "logs").exists()
    said = capsys.readouterr().out
    assert f"is being run by pid {holder.pid} on host" in said


# ---------------------------------------------------------------------- item 8: plans that eat the host
def expected_coalitions(n: int, budget: int) -> float:
    """Distinct non-empty coalitions of ``budget`` uniform permutations of ``n`` players (prefixes), LOO's
    always included: an independent closed form."""
    total = 0.0
    for k in range(1, n + 1):
        c = math.comb(n, k)
        total += n if k == n - 1 else 1.0 if k == n else c * (1 - (1 - 1 / c) ** budget)
    return total


@pytest.mark.timeout(60)
def test_a_huge_permutation_plan_is_estimated_without_listing_it(tmp_path):
    pool = [{"expert": round(0.3 + 0.02 * i, 2)} for i in range(20)]
    config = small_config(tmp_path / "out", pools={"p": pool}, protocols={"debate": {}},  # played: vote's are computed
                          valuation={"estimator": "permutation", "budget": 50_000})
    t0 = time.perf_counter()
    (cell,) = study.plan(config)
    assert time.perf_counter() - t0 < 30  # minutes (and GBs) when every permutation was listed
    assert cell.cost["runs"] == pytest.approx(expected_coalitions(20, 50_000) + 20, rel=1e-9)
    config["valuation"]["budget"] = 10**6  # ~10^7 coalitions: refused, with the key to lower
    with pytest.raises(StudyConfigError, match=r"plans about [\d,]+ coalition runs, more than the 1,000,000 a "
                                               r"cell runs; lower valuation\.budget"):
        study.plan(config)
    config["valuation"]["budget"] = 10**11
    with pytest.raises(StudyConfigError, match=r"^study config: valuation\.budget: 100,000,000,000 permutations"):
        load_config(config)
    config["valuation"] = {"estimator": "exact"}  # 2^20 - 1 coalitions
    with pytest.raises(StudyConfigError, match=r"lower valuation\.estimator"):
        study.plan(config)


@pytest.mark.timeout(60)
def test_a_million_cell_grid_is_refused_before_it_is_built(tmp_path):
    config = small_config(tmp_path / "out", valuation={"seeds": list(range(10**6))})
    with pytest.raises(StudyConfigError, match=r"^study config: valuation: the plan has 1,000,000 cells, more than "
                                               r"the 10,000 a study runs; shorten valuation\.pools/protocols/"
                                               r"tasks/seeds"):
        study.plan(config)


# ---------------------------------------------------------------------- item 9: errors after a passing dry-run
@pytest.mark.parametrize("change, message", [
    ({"tasks": {"x" * 250: {"name": "arith", "n": 3}}}, r"tasks\.'x{59}\.\.\. \(250 characters\): a task label is 1 to 64"),
    ({"protocols": {"vo\0te": {"protocol": "vote"}}}, r"protocols\.'vo\\x00te': a protocol label is 1 to 64"),
    ({"tasks": {"arith": {"n": 3, "options": {"digits": math.nan}}}},
     r"tasks\.arith\.options: the task does not load: arith digits must be an int >= 1, got nan \(float\)"),
    ({"tasks": {"arith": {"n": 3, "options": {"digits": 12}}}},
     r"tasks\.arith\.options: the task does not load: arith digits must be in 1\.\.9, got 12"),
    ({"tasks": {"g": {"name": "gsm8k", "options": {"path": "/no/such.jsonl"}}}},
     r"tasks\.g\.options: the task does not load: gsm8k: no such file '/no/such\.jsonl'"),
    ({"pools": {"two": [{"expert": 0.8}, {"expert": 0.5}], "zoo": "zoo"},
      "training": {"pool": "zoo", "learner": "model_4", "setups": {"vote": {}}, "train_split": "trian"}},
     r"training\.train_split: the task does not load: arith has splits 'train' and 'test', got 'trian'"),
], ids=["long-label", "nul-label", "nan-option", "out-of-range-option", "missing-file", "training-split"])
def test_config_errors_that_used_to_surface_in_a_cell_fail_the_load(change, message, tmp_path):
    config = small_config(tmp_path / "out", **change)
    with pytest.raises(StudyConfigError, match=f"^study config: {message}") as e:
        load_config(config)
    assert "\n" not in str(e.value)


def test_a_long_label_and_its_cell_files_fit_the_file_system(tmp_path):
    label = "t" * 64  # the longest label: its log name (three labels) still fits a file name
    config = small_config(tmp_path / "out", pools={"p" * 64: [{"expert": 0.8}, {"expert": 0.5}]},
                          tasks={label: {"name": "arith", "n": 3}}, protocols={"v" * 64: {"protocol": "vote"}})
    assert study.run(config, progress=False)["run"]["executed"] == 1


# ---------------------------------------------------------------------- item 10: links in the output directory
def test_reports_and_logs_never_write_through_a_link(tmp_path):
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (out / "study.md").symlink_to(victim)
    (out / "study_valuation_heatmap.png").symlink_to(victim)
    (out / "logs" / "valuation__two__vote__arith__seed0.log").symlink_to(victim)
    study.run(small_config(out), progress=False)
    assert victim.read_text() == "keep me"
    assert not (out / "study.md").is_symlink() and "| " in (out / "study.md").read_text()
    log = out / "logs" / "valuation__two__vote__arith__seed0.log"
    assert not log.is_symlink() and "start valuation/two/vote/arith/seed0" in log.read_text()


# ---------------------------------------------------------------------- smaller
def test_bidi_controls_in_a_model_name_are_escaped_in_the_report(tmp_path):
    config = small_config(tmp_path / "out", pools={"two": [{"expert": 0.8, "name": "good\u202eevil"},
                                                           {"expert": 0.5, "name": "plain"}]})
    study.run(config, progress=False)
    text = (tmp_path / "out" / "study.md").read_text()
    assert "\u202e" not in text and "good\\u202eevil" in text


def test_cli_task_option_nan_is_one_line_naming_the_option(capsys):
    code, _, err = cli(capsys, "play", "--pool", "scripted", "--task-option", "digits=nan", "--quiet")
    assert code == 2 and err.count("\n") == 1
    assert "arith digits must be an int >= 1, got 'nan' (str)" in err


@pytest.mark.parametrize("command", ["play", "value"])
def test_cli_max_new_tokens_zero_is_refused(command, capsys):
    with pytest.raises(SystemExit) as e:  # a usage error, before anything loads
        main([command, "--pool", "scripted", "--max-new-tokens", "0"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"crl-envs {command}: error: argument --max-new-tokens: expected an integer >= 1, got 0" in err


def test_cli_value_unwritable_out_fails_before_the_valuation(capsys):
    t0 = time.perf_counter()
    code, out, err = cli(capsys, "value", "--pool", "scripted", "--protocol", "vote", "--n", "3", "--out", "/proc/x")
    assert code == 2 and "--out /proc/x: cannot write there" in err
    assert out == ""  # no report printed: nothing was valued
    assert time.perf_counter() - t0 < 20
