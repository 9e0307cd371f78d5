"""The ``crl-envs`` command line: lazy start-up, one-line errors (exit status 2) naming the fix,
and task options (``--task-option``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from crl_envs.commands import main

HEAVY = ("torch", "transformers", "scipy", "datasets")


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_error(err: str, command: str = "play") -> str:
    """The error line; fails unless stderr holds exactly one line that is the error (no traceback)."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err, err
    assert len(lines) == 1, err
    assert lines[0].startswith(f"crl-envs {command}: error: ") or lines[0].startswith("crl-envs: error: "), lines[0]
    return lines[0]


def test_help_and_a_typo_import_nothing_heavy():
    """What made ``--help`` take 3.6-6 s (transformers, torch, scipy) is not imported before the chosen
    subcommand runs; the timing itself is in benchmarks/cli_startup.py."""
    probe = (
        "import sys\n"
        "from crl_envs.commands import main\n"
        "for argv in (['--help'], ['vaule'], ['play', '--help'], ['value', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        f"print('HEAVY', sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr
    assert "play" in out.stdout and "value" in out.stdout  # --help lists both subcommands
    assert "--ci-level" in out.stdout and "--estimator" in out.stdout  # value --help shows its options


def test_lazy_valuation_exports_every_name():
    """``crl_envs.valuation`` loads its names on first use: each name of ``__all__`` resolves."""
    import crl_envs.valuation as valuation

    missing = [name for name in valuation.__all__ if getattr(valuation, name, None) is None]
    assert missing == [] and callable(valuation.evaluate) and valuation.ESTIMATORS[0] == "exact"


def test_mistyped_command_suggests_the_right_one(capsys):
    code, _, err = run_cli(capsys, "vaule")
    assert code == 2
    line = one_line_error(err)
    assert "unknown command 'vaule' (did you mean 'value'?)" in line and "commands: play, study, value" in line  # sorted: not the order of imports


def test_protocol_option_typo_lists_valid_options(capsys):
    code, _, err = run_cli(capsys, "play", "--pool", "scripted", "--option", "round=3", "--quiet")
    assert code == 2
    line = one_line_error(err)
    assert "unknown option 'round' (did you mean 'rounds'?)" in line
    assert "valid options: rounds, prompts, max_action_chars, render_mode" in line


def test_malformed_option_pair(capsys):
    code, _, err = run_cli(capsys, "play", "--pool", "scripted", "--task-option", "digits")
    assert code == 2
    assert "--task-option expects KEY=VALUE, got 'digits'" in one_line_error(err)


def test_type_error_is_one_line(capsys):
    """A number given as a JSON string reaches the env as a str: a TypeError, reported in one line."""
    code, _, err = run_cli(capsys, "play", "--pool", "scripted", "--option", 'max_action_chars="100"', "--quiet")
    assert code == 2
    line = one_line_error(err)
    assert "TypeError: max_action_chars must be an int >= 1, got '100' (str)" in line


def test_missing_model_is_one_line(capsys, tmp_path):
    """An OSError from loading a model (not a directory, not on the offline hub): one line naming the fix."""
    code, _, err = run_cli(capsys, "play", "--pool", f"hf:{tmp_path / 'no-such-model'}", "--quiet")
    assert code == 2
    line = one_line_error(err)
    assert "HFAgent could not load" in line and "save_pretrained" in line


def test_directory_without_a_model_is_one_line(capsys, tmp_path):
    code, _, err = run_cli(capsys, "play", "--pool", f"hf:{tmp_path}", "--quiet")
    assert code == 2
    assert "config.json" in one_line_error(err)


def test_gsm8k_without_the_hub_names_task_option_path(capsys, monkeypatch):
    """The hub is off (HF_HUB_OFFLINE, as in conftest): a ConnectionError in one line, naming the fix."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    code, _, err = run_cli(capsys, "play", "--task", "gsm8k", "--pool", "scripted", "--quiet")
    assert code == 2
    line = one_line_error(err)
    assert "ConnectionError" in line or "HubUnavailableError" in line
    assert "--task-option path=" in line


def test_unknown_task_option_is_named(capsys):
    code, _, err = run_cli(capsys, "play", "--pool", "scripted", "--task-option", "digit=3", "--quiet")
    assert code == 2
    assert "task 'arith': unknown option 'digit' (did you mean 'digits'?)" in one_line_error(err)


def test_task_option_path_runs_gsm8k_offline(capsys, tmp_path):
    rows = [{"question": f"Tom has {k} apples and buys {k + 1} more. How many?", "answer": f"... #### {2 * k + 1}"}
            for k in range(5)]
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, err = run_cli(capsys, "play", "--protocol", "vote", "--task", "gsm8k", "--task-option", f"path={path}",
                             "--n", "3", "--pool", "scripted")
    assert code == 0, err
    assert "vote_v0 on gsm8k" in out
    questions = re.findall(r"^=== test-\d+: (.*?)  \(reference (\d+)\)$", out, re.M)
    assert len(questions) == 3
    for question, reference in questions:
        k = int(re.search(r"has (\d+)", question).group(1))
        assert int(reference) == 2 * k + 1


def test_task_option_digits(capsys):
    code, out, _ = run_cli(capsys, "play", "--protocol", "vote", "--task-option", "digits=3", "--n", "4",
                           "--pool", "scripted")
    assert code == 0
    operands = [int(x) for q in re.findall(r"^=== \S+: What is (.*?)\?", out, re.M) for x in re.findall(r"\d+", q)]
    assert len(operands) == 8 and max(operands) >= 100  # 3-digit operands (2-digit by default)
    assert all(x < 1000 for x in operands)


def test_traceback_on_request(monkeypatch):
    monkeypatch.setenv("CRL_ENVS_TRACEBACK", "1")
    with pytest.raises(ValueError, match="did you mean 'rounds'"):
        main(["play", "--pool", "scripted", "--option", "round=3", "--quiet"])


def test_value_takes_task_options(capsys, tmp_path):
    """``crl-envs value`` reads ``--task-option`` as ``play`` does: a typo is named, ``path=`` runs GSM8K offline."""
    code, _, err = run_cli(capsys, "value", "--pool", "scripted", "--task-option", "digit=3", "--quiet")
    assert code == 2
    assert "unknown option 'digit' (did you mean 'digits'?)" in one_line_error(err, "value")
    rows = [{"question": f"What is {k} + {k}?", "answer": f"#### {2 * k}"} for k in range(4)]
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, err = run_cli(capsys, "value", "--protocol", "vote", "--task", "gsm8k", "--task-option", f"path={path}",
                             "--pool", "scripted", "--estimator", "loo", "--n", "3", "--no-cache",
                             "--out", str(tmp_path / "out"), "--quiet")
    assert code == 0, err
    report = json.loads((tmp_path / "out" / "vote_v0-gsm8k-loo.json").read_text())
    assert report["task"] == "gsm8k" and len(report["example_ids"]) == 3


def test_pool_typo_suggests_a_named_pool(capsys):
    """``agents.pool("zooo")`` and ``--pool zooo``: one line suggesting ``zoo`` and listing the named pools."""
    import agents

    with pytest.raises(ValueError) as info:
        agents.pool("zooo")
    message = str(info.value)
    assert {"pretrained", "pretrained-llamacpp", "zoo"} <= set(agents.pool_names())
    assert "'zooo' (did you mean 'zoo'?)" in message
    assert f"named pools are {', '.join(agents.pool_names())};" in message
    code, _, err = run_cli(capsys, "play", "--pool", "zooo", "--quiet")
    assert code == 2
    assert "(did you mean 'zoo'?): named pools are" in one_line_error(err)


@pytest.mark.parametrize("command, typo, meant", [("play", "--temprature", "--temperature"),
                                                  ("value", "--estimater", "--estimator"),
                                                  ("value", "--budjet=3", "--budget")])
def test_option_typo_is_one_line_with_a_suggestion(capsys, command, typo, meant):
    with pytest.raises(SystemExit) as info:
        main([command, "--pool", "scripted", typo, "1"])
    assert info.value.code == 2
    line = one_line_error(capsys.readouterr().err, command)
    assert f"unknown option {typo.split('=')[0]} (did you mean {meant}?)" in line
    assert "usage:" not in line


def test_bad_option_value_is_one_line(capsys):
    with pytest.raises(SystemExit):
        main(["value", "--estimator", "shapley"])
    line = one_line_error(capsys.readouterr().err, "value")
    assert "argument --estimator: invalid choice: 'shapley'" in line and "crl-envs value --help" in line


def test_sampled_estimator_without_budget_fails_before_loading_anything():
    """Named by its flag (``--budget``), before the task, the pool or torch is loaded."""
    probe = (
        "import sys\n"
        "from crl_envs.commands import main\n"
        "code = main(['value', '--estimator', 'permutation', '--pool', 'zoo'])\n"
        f"print('CODE', code, 'HEAVY', sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert "CODE 2 HEAVY []" in out.stdout, out.stdout + out.stderr
    line = one_line_error(out.stderr, "value")
    assert "--estimator permutation needs --budget N" in line and "budget=" not in line


def test_ci_level_reaches_the_report(capsys, tmp_path):
    """``--ci-level 0.5`` gives 50% CIs: inside the 95% ones of the same run (same resamples, same seed)."""
    reports = {}
    for level in ("0.5", "0.95"):
        code, out, err = run_cli(capsys, "value", "--protocol", "vote", "--pool", "scripted", "--estimator", "loo",
                                 "--n", "12", "--ci-level", level, "--no-cache", "--out", str(tmp_path / level),
                                 "--quiet")
        assert code == 0, err
        assert f"[{round(float(level) * 100)}% CI]" in out
        reports[level] = json.loads((tmp_path / level / "vote_v0-arith-loo.json").read_text())
    assert reports["0.5"]["ci_level"] == 0.5
    narrow, wide = reports["0.5"]["measures"]["loo"]["ci"], reports["0.95"]["measures"]["loo"]["ci"]
    assert all(wide[m][0] <= narrow[m][0] <= narrow[m][1] <= wide[m][1] for m in wide)
    width = {level: sum(hi - lo for lo, hi in cis.values()) for level, cis in (("0.5", narrow), ("0.95", wide))}
    assert width["0.5"] < width["0.95"]


def test_value_prints_and_writes_the_studys_verdict(capsys, tmp_path):
    """``crl-envs value`` reaches the study's verdict (the report's method, which the study calls too): it prints
    it and writes it with the cross-fit statistic into its JSON, at alpha = 1 - --ci-level (one level)."""
    from crl_envs import stats
    from crl_envs.valuation import ValuationReport

    code, out, err = run_cli(capsys, "value", "--protocol", "vote", "--pool", "scripted", "--estimator", "loo",
                             "--n", "40", "--no-cache", "--out", str(tmp_path), "--quiet")
    assert code == 0, err
    written = json.loads((tmp_path / "vote_v0-arith-loo.json").read_text())
    (measure,) = written["crossfit"]  # LOO only: no Shapley, no Shapley minus its singleton
    v = written["crossfit"][measure]
    assert v["verdict"] in stats.VERDICTS and v["alpha"] == pytest.approx(0.05) and v["tau_ci_level"] == 0.95
    again = ValuationReport.from_json(tmp_path / "vote_v0-arith-loo.json").verdict(measure)
    assert json.loads(json.dumps(again)) == v  # recomputed from the tables: the same verdict, to the digit
    assert v["verdict"] == stats.verdict(v["kendall_tau"], v["p_value"], v["min_p_value"], v["tau_ci"],
                                         questions=v["crossfit_questions"])
    assert f"(p = {v['p_value']:.3f}): {v['verdict']}" in out and "95% interval" in out


@pytest.mark.parametrize("level, shown", [("95", "got 95 (0.95 for 95%)"), ("1", "got 1"), ("x", "got 'x'")])
def test_ci_level_outside_0_1_is_one_line(capsys, level, shown):
    with pytest.raises(SystemExit) as info:
        main(["value", "--ci-level", level])
    assert info.value.code == 2
    line = one_line_error(capsys.readouterr().err, "value")
    assert "argument --ci-level: expected a fraction in (0, 1) such as 0.95" in line and shown in line


def test_a_user_mistake_is_a_library_error_of_the_builtin_kind(capsys):
    """The library's errors subclass the built-in they replace (``except ValueError`` keeps working) and the
    command prints them as one line, named by the built-in kind."""
    import agents
    from agents.hub import HubUnavailableError
    from agents.openai import OpenAIRequestError
    from crl_envs.sandbox.boundary import SandboxUnavailable
    from crl_envs.study.config import StudyConfigError
    from crl_kit.errors import ConfigError, ConfigTypeError, CrlEnvsError, ModelError

    with pytest.raises(ConfigError) as info:
        agents.pool("zooo")
    assert isinstance(info.value, ValueError) and isinstance(info.value, CrlEnvsError)
    assert issubclass(ConfigTypeError, TypeError) and issubclass(ConfigTypeError, ValueError)
    assert issubclass(OpenAIRequestError, ModelError) and issubclass(OpenAIRequestError, RuntimeError)
    assert issubclass(StudyConfigError, ConfigError) and issubclass(HubUnavailableError, ConnectionError)
    assert issubclass(SandboxUnavailable, CrlEnvsError) and issubclass(SandboxUnavailable, RuntimeError)
    code, _, err = run_cli(capsys, "play", "--pool", "scripted", "--option", 'max_action_chars="100"', "--quiet")
    assert code == 2 and "error: TypeError: max_action_chars must be an int" in one_line_error(err)


@pytest.mark.parametrize("bug", [KeyError("model_9"), TypeError("unsupported operand"), RuntimeError("boom")])
def test_a_bug_shows_its_traceback(capsys, monkeypatch, bug):
    """An exception that is not the library's (a bug) is not printed as a user's mistake: it propagates, with
    its traceback, and nothing is printed as an ``error:`` line."""
    import crl_envs.protocols as protocols

    def broken(*args, **kwargs):
        raise bug

    monkeypatch.setattr(protocols, "check_options", broken)
    with pytest.raises(type(bug)) as info:
        main(["play", "--pool", "scripted", "--quiet"])
    assert info.value is bug
    assert "error:" not in capsys.readouterr().err


def test_a_model_that_fails_surfaces_as_a_model_error_and_a_broken_one_as_its_bug():
    """The runner's "agent X failed" wrapper: a failure the model surfaced is a ``ModelError`` (one line in the
    command); an unexpected exception inside ``generate`` stays a plain ``RuntimeError`` chained to the bug."""
    import agents
    from crl_envs import protocols, run_episodes, tasks
    from crl_kit.errors import ModelError, RunError

    def refuse(example, messages):
        raise ModelError("server said no; check the base URL")

    def crash(example, messages):
        return {}["missing"]

    task = tasks.load("arith", n=1, seed=0)
    for respond, kind, cause in ((refuse, ModelError, ModelError), (crash, RuntimeError, KeyError)):
        pool = agents.pool([agents.ScriptedAgent("a", respond), agents.ScriptedAgent.expert("b", 1.0)])
        with pytest.raises(RuntimeError, match=r"agent model_0 \(a\) failed on a batch") as info:
            run_episodes(protocols.get("vote"), pool, task, seed=0)
        assert isinstance(info.value, kind) and isinstance(info.value.__cause__, cause)
        assert isinstance(info.value, RunError) == (kind is ModelError)
