"""Cell specs as frozen dataclasses (#52 item 6): each kind's fingerprint is the digest of the dict its spec
was before it was a class (hashed here literally, with hashlib), a bad field raises one line at construction,
and specs survive pickling and a JSON round trip."""

from __future__ import annotations

import hashlib
import json
import pickle
from dataclasses import FrozenInstanceError, replace

import pytest

from crl_envs import study
from crl_envs.study.cells.baseline import BaselineCell
from crl_envs.study.cells.crossplay import CrossplayCell
from crl_envs.study.cells.lr_sweep import SweepCell
from crl_envs.study.cells.specs import CrossplaySpec, SettingSpec, SweepSpec, TrainingSpec, ValuationSpec
from crl_envs.study.cells.training import TrainingCell
from crl_envs.study.cells.valuation import ValuationCell
from crl_kit.errors import ConfigError, ConfigTypeError

TASK = {"name": "arith", "n": 200, "split": "test", "seed": 0, "options": {"digits": 2, "operations": ["+", "-"]}}


def legacy_fingerprint(kind: str, spec: dict) -> str:
    """The fingerprint a cell had when its spec was this dict: sha256 of the canonical JSON of version, kind
    and spec (written out here, not through crl_kit.serial.digest)."""
    text = json.dumps({"version": 1, "kind": kind, **spec}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def setting_dict(**more) -> dict:
    return {"pool": "zoo", "pool_label": "zoo", "learner": "model_4", "setup_label": "judge", "protocol": "judge",
            "options": {"judge": "model_4", "fallback": "none"}, "task": TASK, "task_label": "arith",
            "train_split": "train", "eval_split": "test", "n_train": 1000, "n_eval": 200, "max_new_tokens": 24,
            "threads": 1, **more}


def trainer_dict(setting: dict | None = None, **more) -> dict:
    """A trainer cell's legacy dict: the setting's keys (``setting``: learners, schedule), then the trainer's."""
    return {**setting_dict(**(setting or {})), "trainer": "crl", "seed": 0, "steps": 20, "learning_rate": 1e-3,
            "questions_per_step": 8, "num_generations": 8, "shapley_coalitions": None, "lora": None, **more}


VALUATION = {"pool": ["zoo:zoo-nocarry", {"expert": 0.8, "name": "e"}], "pool_label": "specialists",
             "protocol": {"protocol": "vote", "options": {}}, "protocol_label": "vote", "task": TASK,
             "task_label": "arith", "estimator": {"exact_up_to": 6, "larger": "permutation"}, "samples": 1, "seed": 0,
             "budget": 200, "sampling": {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 24}, "ci_level": 0.95,
             "bootstrap_resamples": 2000}
RULE = {"rule": "largest_kept", "tolerance": 0.0, "sweep": {"0.001": "5e4973bdbd0f9dde1a1841a19206158b"}}
CASES = [  # (cell class, spec class, the legacy dict)
    (ValuationCell, ValuationSpec, VALUATION),
    (BaselineCell, SettingSpec, setting_dict()),
    (BaselineCell, SettingSpec, setting_dict(learners=["model_4", "model_1"])),
    (BaselineCell, SettingSpec, setting_dict(learners=["model_4", "model_1"], schedule="round_robin")),
    (SweepCell, SweepSpec, trainer_dict(trainer="grpo", setup_label="alone", protocol="vote", options={},
                                        seed=1000, selection={"split": "train", "seed": 1, "n": 100}, selection_n=100)),
    (TrainingCell, TrainingSpec, trainer_dict(learning_rate=RULE, lora={"r": 8, "alpha": 16})),
    (TrainingCell, TrainingSpec, trainer_dict({"learners": ["model_4", "model_1"]}, trainer="shapley_credit",
                                              shapley_coalitions=3)),
    (CrossplayCell, CrossplaySpec, trainer_dict({"learners": ["model_4", "model_1"], "schedule": "round_robin"},
                                                training_fingerprint="0123456789abcdef0123456789abcdef")),
]


@pytest.mark.parametrize("cell_class, spec_class, legacy", CASES, ids=lambda c: getattr(c, "__name__", None))
def test_a_specs_fingerprint_is_the_digest_of_its_legacy_dict(cell_class, spec_class, legacy):
    spec = spec_class(**legacy)
    assert spec.payload() == legacy and list(spec.payload()) == list(legacy)  # same keys, values, order
    cell = cell_class.make(f"{cell_class.kind}/x", spec)
    assert cell.fingerprint == legacy_fingerprint(cell_class.kind, legacy)
    assert spec_class.from_payload(json.loads(json.dumps(spec.payload()))) == spec  # JSON round trip
    again = pickle.loads(pickle.dumps(cell))
    assert again == cell and again.fingerprint == cell.fingerprint and type(again.spec) is spec_class


def test_an_optional_key_absent_before_stays_absent():
    one = SettingSpec(**setting_dict())
    assert one.learners is None and "learners" not in one.payload() and "schedule" not in one.payload()
    resolved = replace(TrainingSpec(**trainer_dict(learning_rate=RULE)), learning_rate=1e-4,
                       learning_rate_choice={"learning_rate": 1e-4})
    assert resolved.payload()["learning_rate_choice"] == {"learning_rate": 1e-4}
    assert "learning_rate_choice" not in TrainingSpec(**trainer_dict()).payload()


@pytest.mark.parametrize("spec_class, legacy, error, message", [
    (SettingSpec, setting_dict(n_eval=0), ConfigError, "SettingSpec.n_eval must be an int >= 1, got 0"),
    (TrainingSpec, trainer_dict(steps="20"), ConfigTypeError, "TrainingSpec.steps must be an int >= 1, got '20' (str)"),
    (TrainingSpec, trainer_dict(learning_rate=-1.0), ConfigError,
     "TrainingSpec.learning_rate must be a positive number or a rule table, got -1.0"),
    (SettingSpec, setting_dict(learners=["model_1", "model_4"]), ConfigError,
     "SettingSpec.learners must be two or more learner ids starting with learner 'model_4'"),
    (SettingSpec, setting_dict(schedule="round_robin"), ConfigError,
     "SettingSpec.schedule is 'round_robin' without learners; a schedule needs several learners"),
    (ValuationSpec, {**VALUATION, "ci_level": 1.5}, ConfigError, "ValuationSpec.ci_level must be a number in (0, 1)"),
    (ValuationSpec, {**VALUATION, "task_label": "a/b"}, ConfigError,
     "ValuationSpec.task_label must be a non-empty label without '/'"),
    (CrossplaySpec, trainer_dict(training_fingerprint="abc"), ConfigError,
     "CrossplaySpec.training_fingerprint must be a cell fingerprint (32 hex digits), got 'abc'"),
    (SweepSpec, trainer_dict(selection={"split": "train", "seed": 1, "n": 100}, selection_n=50), ConfigError,
     "SweepSpec.selection_n is 50 but selection.n is 100"),
])
def test_a_bad_field_raises_one_line_at_construction(spec_class, legacy, error, message):
    with pytest.raises(error) as e:
        spec_class(**legacy)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_a_payload_with_an_unknown_or_missing_key_and_a_wrong_spec_class_are_refused():
    with pytest.raises(ConfigError, match=r"^SettingSpec has no field 'n_evals' \(did you mean 'n_eval'\?\); remove it$"):
        SettingSpec.from_payload({**setting_dict(), "n_evals": 3})
    with pytest.raises(ConfigError, match=r"^SettingSpec lacks threads; "):
        SettingSpec.from_payload({k: v for k, v in setting_dict().items() if k != "threads"})
    with pytest.raises(ConfigTypeError, match=r"^a training cell's spec is a TrainingSpec, got a SettingSpec; "):
        TrainingCell.make("training/x", SettingSpec(**setting_dict()))
    with pytest.raises(FrozenInstanceError):
        SettingSpec(**setting_dict()).n_eval = 3  # type: ignore[misc]


def test_every_planned_spec_survives_json_and_pickle(tmp_path):
    """Every cell of paper-small's plan: its spec rebuilt from its payload's JSON is equal and gives the same
    fingerprint (what a worker or a Ray task receives is the planned cell)."""
    planned = study.cells(study.load_config("studies/paper-small.toml", out=tmp_path))
    assert {c.kind for c in planned} >= {"valuation", "lr_sweep", "baseline", "training"}
    for cell in planned:
        spec = type(cell.spec).from_payload(json.loads(json.dumps(cell.spec.payload())))
        assert spec == cell.spec and type(cell).make(cell.id, spec).fingerprint == cell.fingerprint, cell.id
        assert legacy_fingerprint(cell.kind, json.loads(json.dumps(cell.spec.payload()))) == cell.fingerprint
    assert pickle.loads(pickle.dumps(planned)) == planned
