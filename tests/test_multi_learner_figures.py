"""docs/multi_learner.json (``python examples/multi_learner.py --protocol vote --out docs/multi_learner.json``)
is what README.md and docs/training.md quote, its summaries follow from its per-seed numbers, and one cheap
run of it (one learner, one seed) is re-run and gives the committed per-question numbers bit for bit."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = json.loads((ROOT / "docs" / "multi_learner.json").read_text())


def _example():
    spec = importlib.util.spec_from_file_location("multi_learner_example", ROOT / "examples" / "multi_learner.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXAMPLE = _example()
#: a cross-play entry's figures over all the questions played (not comparable on a prefix)
_MEANS = ("trained_with_accuracy", "unseen_accuracy", "trained_with_gain", "unseen_gain", "gap")


def test_summaries_follow_from_the_per_seed_runs():
    """Every condition's summary (CIs, cross-play gaps, cost) is summarise() of its committed per-seed runs."""
    assert set(COMMITTED["conditions"]) == set(EXAMPLE.CONDITIONS) == set(COMMITTED["runs"])
    for name, runs in COMMITTED["runs"].items():
        assert [r["seed"] for r in runs] == COMMITTED["seeds"]
        assert all(len(r["system"]) == COMMITTED["n_eval"] for r in runs)
        assert EXAMPLE.summarise(COMMITTED["before"], runs) == COMMITTED["conditions"][name], name
    assert COMMITTED["before"]["system"] == np.mean(COMMITTED["before"]["per_question"]["system"])
    assert (COMMITTED["settings"], COMMITTED["pool"]) == (EXAMPLE.SETTINGS, EXAMPLE.POOL)


@pytest.mark.parametrize("page", ["README.md", "docs/training.md"])
def test_docs_quote_the_committed_table(page):
    """The page's several-learners table is table(brief=True) of the committed file, and the text before
    it names the committed settings and the system's accuracy before training."""
    text = (ROOT / page).read_text(encoding="utf-8")
    quoted = EXAMPLE.table(COMMITTED, brief=True)
    header = quoted.splitlines()[0]
    assert text.count(header) == 1, f"{page}: no single table starting {header!r}"
    start = text.index(header)
    rows = text[start:].split("\n\n", 1)[0].strip()
    assert rows == quoted, f"{page}: regenerate the table with examples/multi_learner.py's table(out, brief=True)"
    intro = " ".join(text[:start].rstrip().rsplit("\n\n", 1)[-1].split())  # one line
    c = COMMITTED
    for figure in (f"{c['steps']} steps", f"{len(c['seeds'])} seeds", f"{c['n_eval']} held-out questions",
                   f"system {c['before']['system']:.3f} before", c["protocol"]):
        assert figure in intro, f"{page}: the text before the table should say {figure!r}"


def test_docstring_quotes_the_committed_table():
    """The example's docstring quotes its full table, its cost columns marked as measured under the committed
    runs' load."""
    assert EXAMPLE.table(COMMITTED) in EXAMPLE.__doc__
    loads = [float(line.split("load average:")[1].split(",")[0])
             for c in COMMITTED["conditions"].values() for line in c["loads"]]  # uptime's 1-minute average
    assert f"load average {min(loads):.1f} to {max(loads):.1f}), so\ns/step is a loaded figure" in EXAMPLE.__doc__


@pytest.mark.slow
def test_one_learner_seed_reproduces_bit_for_bit():
    """The cheapest cell (one learner, the first seed) re-run on the first 20 held-out questions (a prefix
    of the committed 100: each question is played on its own) gives the committed per-question scores:
    before, after, each rookie alone, and both cross-play gains."""
    torch.set_num_threads(1)  # as the example
    c, n = COMMITTED, 20
    seed = c["seeds"][0]
    (committed,) = [r for r in c["runs"]["one"] if r["seed"] == seed]
    before = EXAMPLE.untrained(c["protocol"], EXAMPLE.held_out(n), c["options"])
    assert before.system.tolist() == c["before"]["per_question"]["system"][:n]
    assert {j: v.tolist() for j, v in before.learners.items()} == \
        {j: v[:n] for j, v in c["before"]["per_question"].items() if j != "system"}
    fresh = EXAMPLE.run_seed(c["protocol"], "one", seed, c["steps"], EXAMPLE.held_out(n), c["options"])
    assert fresh["system"] == committed["system"][:n]
    assert fresh["alone"] == {j: v[:n] for j, v in committed["alone"].items()}
    assert set(fresh["crossplay"]) == set(committed["crossplay"]) == {"model_2"}
    got, want = fresh["crossplay"]["model_2"], committed["crossplay"]["model_2"]
    assert {k: v for k, v in got.items() if k not in ("per_question", *_MEANS)} == \
        {k: v for k, v in want.items() if k not in ("per_question", *_MEANS)}  # which settings were played
    assert got["per_question"] == {k: v[:n] for k, v in want["per_question"].items()}
    assert fresh["state_bytes"] == committed["state_bytes"]
