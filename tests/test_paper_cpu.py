"""studies/paper-cpu.toml (#55): it loads, its dry run states the training power and the wall time, and its
settings are exactly the candidates the probe chose (replayed on the recorded probe numbers,
docs/paper-cpu-probe.json; the slow test re-plays the probe on one setting)."""

from __future__ import annotations

import collections
import json
import math
import re
from pathlib import Path

import pytest

from crl_envs import study
from crl_envs.study import load_config
from crl_envs.study.cells.setting import training_settings
from crl_envs.study.plan import estimate
from crl_envs.study.probe import probe_verdict, setting_probe
from crl_envs.study.stats import TRAINING_PLANTING, training_power
from crl_envs.study.walltime import SECONDS_PER_CALL, wall_estimate
from crl_kit.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "studies" / "paper-cpu.toml"
CANDIDATES = ROOT / "studies" / "paper-cpu-candidates.toml"
RECORD = ROOT / "docs" / "paper-cpu-probe.json"
#: Each preset chosen by a recorded probe: (preset, its candidates, the probe's record). paper-cpu2's probe used
#: 400 score questions and a margin of 0.05 (the record says so), on three tasks.
PROBED = [(PRESET, CANDIDATES, RECORD),
          (ROOT / "studies" / "paper-cpu2.toml", ROOT / "studies" / "paper-cpu2-candidates.toml",
           ROOT / "docs" / "paper-cpu2-probe.json")]


def _record(path: Path = RECORD) -> dict:
    return json.loads(path.read_text())


@pytest.mark.parametrize("preset_path, candidates_path, record_path", PROBED, ids=lambda p: p.stem)
def test_the_preset_lists_exactly_the_candidates_the_recorded_probe_chose(preset_path, candidates_path, record_path):
    record = _record(record_path)
    margin = record.get("margin", 0.0)
    candidates, preset = load_config(candidates_path).training, load_config(preset_path).training
    assert set(record["settings"]) == {f"{k}/{t}" for k in candidates.setups for t in candidates.tasks}
    chosen = {label for label, e in record["settings"].items() if probe_verdict(e, margin=margin)["passed"]}
    assert chosen == {f"{k}/{t}" for k, s in preset.setups.items() for t in s.trained_tasks(preset.tasks)}
    for label, e in record["settings"].items():
        assert probe_verdict(e, margin=margin)["passed"] == e["passed"]  # the recorded choice is the rule's
        setup = candidates.setups[label.split("/")[0]]
        assert (setup.learners[0], setup.protocol) == (e["learner"], e["protocol"])
    for label in {c.split("/")[0] for c in chosen}:  # each chosen setting trained as probed: protocol, learner, options
        a, b = candidates.setups[label], preset.setups[label]
        assert (a.protocol, a.options, a.learners) == (b.protocol, b.options, b.learners)
    assert set(preset.tasks) <= set(candidates.tasks) and "placebo" in preset.trainers and len(preset.seeds) >= 3


def test_paper_cpu2_chose_at_least_six_settings_and_pilots_on_three_seeds():
    """#55: six or more comparable settings need more candidates through the probe (paper-cpu-pilot: 3 of 8 passed
    its gates); a pilot that sees the spread between fits needs several seeds."""
    config = load_config(PROBED[1][0])
    t = config.training
    settings = training_settings(config)
    assert len(settings) == 14 and len({s.common.learner for s in settings}) == 4  # model_0 to model_3 learn
    assert len(t.pilot.seeds) == 3 and not set(t.pilot.seeds) & set(t.seeds)
    assert sum(c.kind == "training" for c in study.plan(config)) == 14 * 3 * 3


def test_the_probe_refuses_no_signal_and_a_seat_whose_deletion_scores_more():
    ok = probe_verdict({"zero_variance": 0.5, "before": 0.7, "without_learner": 0.66})
    assert ok == {"passed": True, "reason": None}
    silent = probe_verdict({"zero_variance": 0.9, "before": 0.7, "without_learner": 0.66})
    assert not silent["passed"] and "no signal: 90%" in silent["reason"]
    deleted = probe_verdict({"zero_variance": 0.25, "before": 0.17, "without_learner": 0.545})
    assert not deleted["passed"] and "0.545 without the learner, 0.170 with it" in deleted["reason"]


def test_the_probes_margin_refuses_a_seat_that_adds_too_little_to_tell_a_gain_from_deletion():
    thin = {"zero_variance": 0.12, "before": 0.619, "without_learner": 0.600}  # paper-cpu-pilot's blender, on test
    assert probe_verdict(thin)["passed"] and probe_verdict(thin, margin=0.019)["passed"]
    refused = probe_verdict(thin, margin=0.05)
    assert refused == {"passed": False, "reason": "the seat adds +1.9 points, below the margin of 5.0: a small gain "
                                                  "could not be told from deleting the learner"}
    deleted = probe_verdict({"zero_variance": 0.2, "before": 0.5, "without_learner": 0.6}, margin=0.05)
    assert deleted["reason"].startswith("deletion would pass for a gain")  # one reason, not two
    with pytest.raises(ValueError, match="margin must be in \\[0, 1\\)"):
        probe_verdict(thin, margin=1.5)


@pytest.mark.parametrize("preset_path", [p for p, _, _ in PROBED], ids=lambda p: p.stem)
def test_the_dry_run_states_the_training_power_and_the_wall_time(preset_path):
    config = load_config(preset_path)
    text = study.describe_plan(config, study.plan(config))
    t = config.training
    settings = len(training_settings(config))
    power = training_power(settings, len(t.seeds), t.n_eval,
                           [b for b in t.trainers if b != "crl"], difference=0.02, alpha=t.alpha)
    stated = re.search(r"Training: power (\d\.\d\d)[^\n]* to call C-RL better than placebo across (\d+) setting",
                       text)
    assert stated and float(stated[1]) == round(power["value"], 2) and int(stated[2]) == settings
    wall = re.search(r"estimated wall time: ([\d,]+) minutes", text)
    assert wall and int(wall[1].replace(",", "")) == round(wall_estimate(config, study.plan(config))["seconds"] / 60)
    assert "Training power if the settings' true differences spread with SD 0 / 1 / 2 points:" in text


def test_the_setting_sd_replaces_only_the_planted_spread():
    at = {sd: training_power(6, 3, 400, ["grpo", "placebo"], setting_sd=sd, sims=200) for sd in (0.0, 0.02)}
    p = TRAINING_PLANTING
    assert at[0.0]["setting_mean_sd"] == pytest.approx(math.sqrt(p["disagreeing_share"] / 400 + p["seed_sd"] ** 2 / 3))
    assert at[0.0]["value"] > at[0.02]["value"]  # a wider spread of true differences, less power
    with pytest.raises(ConfigError, match="setting_sd in \\[0, 1\\)"):
        training_power(6, 3, 400, ["placebo"], setting_sd=-0.01)


def test_the_wall_rates_are_paper_smalls_recorded_seconds_per_planned_call():
    config = load_config(ROOT / "studies" / "paper-small.toml")
    planned = estimate(config, [c for c in study.cells(config) if c.kind != "valuation"])
    recorded = json.loads((ROOT / "docs" / "study.json").read_text())["cells"]
    seconds, calls = collections.Counter(), collections.Counter()
    for c in planned:
        key = (c.kind, c.spec.trainer) if c.kind == "training" else (c.kind, None)
        seconds[key] += recorded[c.id]["seconds"]
        calls[key] += c.cost["calls"]
    for (kind, trainer), s in seconds.items():
        rate = SECONDS_PER_CALL[kind] if trainer is None else SECONDS_PER_CALL[kind][trainer]
        assert rate == pytest.approx(s / calls[(kind, trainer)], rel=0.01), (kind, trainer)


def test_the_pilot_rate_is_paper_cpu_pilots_recorded_seconds_per_planned_call():
    config = load_config(ROOT / "studies" / "paper-cpu-pilot.toml")
    planned = estimate(config, [c for c in study.cells(config) if c.kind == "pilot"])
    recorded = json.loads((ROOT / "docs" / "paper-cpu-pilot" / "study.json").read_text())["cells"]
    rate = sum(recorded[c.id]["seconds"] for c in planned) / sum(c.cost["calls"] for c in planned)
    assert SECONDS_PER_CALL["pilot"]["grpo"] == pytest.approx(rate, rel=0.01)


@pytest.mark.slow
@pytest.mark.parametrize("preset_path, candidates_path, record_path", PROBED, ids=lambda p: p.stem)
def test_the_probe_replays_its_recorded_numbers_on_a_chosen_setting(preset_path, candidates_path, record_path):
    import dataclasses

    record = _record(record_path)
    config = load_config(candidates_path)
    label = next(k for k, e in record["settings"].items() if e["passed"])
    setup, task = label.split("/")
    one = dataclasses.replace(config, training=dataclasses.replace(
        config.training, setups={setup: dataclasses.replace(config.training.setups[setup], tasks=(task,))}))
    (probed,) = setting_probe(one, questions=record["questions"], score_questions=record["score_questions"],
                              seed=record["seed"], margin=record.get("margin", 0.0)).values()
    for k in ("zero_variance", "before", "without_learner", "passed"):
        assert probed[k] == record["settings"][label][k], k


def test_the_dry_runs_probe_table_names_each_setting_and_its_choice():
    from crl_envs.study.probe import probe_markdown

    record = _record()
    lines = probe_markdown(record["settings"])
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| setting")]
    assert len(rows) == len(record["settings"])
    chosen = [k for k, e in record["settings"].items() if e["passed"]]
    assert lines[-1] == f"probe: {len(chosen)} of {len(record['settings'])} settings chosen ({', '.join(chosen)})"
    assert "| cascade-first-rookie/arith | model_4 | 50% | 0.090 | 0.650 | not comparable: deletion would pass for a " \
           "gain: the system scores 0.650 without the learner, 0.090 with it |" in rows


#: The committed runs, each from an empty directory: its preset, its directory under docs/, its cells.
COMMITTED_RUNS = [("paper-cpu", 89), ("paper-cpu-pilot", 110), ("paper-cpu2", 248)]


@pytest.mark.parametrize("name, cells", COMMITTED_RUNS)
def test_the_committed_run_is_re_derived_from_its_committed_cells(tmp_path, name, cells):
    """docs/<name>/ (the run of studies/<name>.toml from an empty directory): its cells are the ones the preset
    plans today (fingerprints), and study.json's training tables, gates and verdicts (with a pilot: its curve and
    choice) and study.md follow from the committed cell results (cells.tar.gz) by the study's own code, with no
    cell played again."""
    import tarfile

    run = ROOT / "docs" / name
    committed = json.loads((run / "study.json").read_text())
    config = load_config(ROOT / "studies" / f"{name}.toml", out=tmp_path)
    planned = study.plan(config)
    assert {c.id: c.fingerprint for c in planned} == {k: v["fingerprint"] for k, v in committed["cells"].items()}
    assert len(planned) == cells
    with tarfile.open(run / "cells.tar.gz") as archive:
        archive.extractall(tmp_path, filter="data")
    study.run(config, out=tmp_path, progress=False)
    fresh = json.loads((tmp_path / "study.json").read_text())
    assert (fresh["run"]["cached"], fresh["run"]["executed"]) == (cells, 0)
    assert fresh["training"] == committed["training"]
    # the report differs only in its last line (this re-derivation's wall time and load)
    old_md, new_md = ((d / "study.md").read_text().splitlines() for d in (run, tmp_path))
    assert old_md[:-1] == new_md[:-1] and old_md[-1].startswith(f"Cells: {cells} ({cells} run now")
    # the committed plots are the ones the study draws from these tables
    assert sorted(p.name for p in run.glob("*.png")) == sorted(p.name for p in tmp_path.glob("*.png"))
    summary = committed["training"]["summary"]
    assert summary["comparable_settings"] == sum(s["comparable"] for s in committed["training"]["settings"])
