"""Valuation on a Ray cluster: the same numbers as the local executor, one cache, faults survived.

One local cluster for the module (``ray.init(num_cpus=2)``, started once, shut down after). Every
comparison is against ``executor="local"`` on the same game, bit for bit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install 'crl-envs[ray]'")

import agents  # noqa: E402
from agents import ScriptedAgent  # noqa: E402
from crl_envs import tasks, valuation  # noqa: E402
from crl_envs.valuation import RayExecutor, ValuationReport, evaluate  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# classes defined here travel by value (Ray workers cannot import a pytest test module)
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cluster():
    """One local Ray cluster of 2 CPUs for the whole module."""
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def always(answer: str):
    return lambda example, messages: f"The answer is {answer}."


def mixed_pool():
    return agents.pool([ScriptedAgent.expert(f"expert-{a}", a, seed=3) for a in (0.85, 0.6, 0.45)]
                       + [ScriptedAgent("zero", always("0"))])


def assert_same(a: ValuationReport, b: ValuationReport) -> None:
    assert a.measures.keys() == b.measures.keys()
    for name, m in a.measures.items():
        np.testing.assert_array_equal(b.measures[name].per_question, m.per_question, err_msg=name)
        assert b.measures[name].ci == m.ci, name
    np.testing.assert_array_equal(a.system, b.system)
    assert (a.system_evaluations, a.individual_evaluations) == (b.system_evaluations, b.individual_evaluations)


def test_scripted_exact_and_loo_equal_local_and_rerun_is_cached(cluster, tmp_path):
    task = tasks.load("arith", n=20, seed=1)
    for estimator in ("exact", "loo"):
        local = evaluate("debate", mixed_pool(), task, estimator=estimator, cache_dir=tmp_path / f"local-{estimator}",
                         progress=False)
        remote = evaluate("debate", mixed_pool(), task, estimator=estimator, cache_dir=tmp_path / f"ray-{estimator}",
                          progress=False, executor="ray")
        assert_same(local, remote)
        assert remote.system_evaluations == (15 if estimator == "exact" else 5)
        assert len(set(remote.shapley.means if remote.shapley else remote.loo.means)) > 1  # a non-trivial game
    # the cache the driver wrote: a Ray rerun and a local run both execute 0 coalitions
    executor = RayExecutor()
    again = evaluate("debate", mixed_pool(), task, cache_dir=tmp_path / "ray-exact", progress=False, executor=executor)
    assert (again.system_evaluations, again.individual_evaluations, executor.submitted) == (0, 0, 0)
    assert "from cache" in str(again) and again.cached_evaluations == 15 + 4
    here = evaluate("debate", mixed_pool(), task, cache_dir=tmp_path / "ray-exact", progress=False)
    assert (here.system_evaluations, here.individual_evaluations) == (0, 0)
    assert_same(again, here)
    for path in (tmp_path / "ray-exact").glob("*/*.json"):
        json.loads(path.read_text())  # every file whole, no temp file left behind
    assert not list((tmp_path / "ray-exact").glob("*/.*.tmp"))


class KillsItsWorker(ScriptedAgent):
    """An expert whose first call in a Ray worker kills that worker process (SIGKILL, mid-coalition);
    a marker file makes the retry succeed. In the driver it never kills."""

    def __init__(self, name: str, accuracy: float, marker: Path):
        inner = ScriptedAgent.expert(name, accuracy, seed=3)
        super().__init__(name, lambda ex, msgs: "")
        self.inner, self.marker, self.driver_pid = inner, str(marker), os.getpid()
        self._fingerprint = "kills-" + inner.fingerprint

    def _generate(self, requests):
        if os.getpid() != self.driver_pid and not os.path.exists(self.marker):
            Path(self.marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return self.inner._generate(requests)


def test_worker_killed_mid_coalition_is_retried(cluster, tmp_path):
    task = tasks.load("arith", n=12, seed=2)
    marker = tmp_path / "killed"
    pool = lambda: agents.pool([KillsItsWorker("k", 0.7, marker), ScriptedAgent.expert("e", 0.5, seed=3)])  # noqa: E731
    remote = evaluate("debate", pool(), task, cache_dir=tmp_path / "ray", progress=False, executor="ray")
    assert marker.exists(), "no worker was killed: the test proves nothing"
    local = evaluate("debate", pool(), task, cache_dir=tmp_path / "local", progress=False)
    assert_same(local, remote)


def test_unreachable_address_is_one_fast_line(cluster):
    t0 = time.monotonic()
    with pytest.raises(ConnectionError) as info:
        evaluate("vote", mixed_pool(), tasks.load("arith", n=3), cache_dir=False, progress=False,
                 executor=RayExecutor("127.0.0.1:1"))
    assert time.monotonic() - t0 < 10
    message = str(info.value)
    assert "\n" not in message and "127.0.0.1:1" in message and "ray start --head" in message


def test_missing_ray_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` does when Ray is not installed
    with pytest.raises(ImportError, match=r"pip install 'crl-envs\[ray\]'"):
        evaluate("vote", mixed_pool(), tasks.load("arith", n=3), cache_dir=False, progress=False, executor="ray")


DRIVER_SCRIPT = textwrap.dedent('''
    import os, sys, time
    import agents
    from agents import ScriptedAgent
    from crl_envs import tasks, valuation

    class Slow(ScriptedAgent):
        """An expert that sleeps per batch (its fingerprint does not depend on the sleep)."""
        def __init__(self, name, accuracy, pause):
            inner = ScriptedAgent.expert(name, accuracy)
            super().__init__(name, lambda ex, msgs: "")
            self.inner, self.pause, self._fingerprint = inner, pause, "slow-" + inner.fingerprint
        def _generate(self, requests):
            time.sleep(self.pause)
            return self.inner._generate(requests)

    def run(cache_dir, address, pause):
        pool = agents.pool([Slow(f"e{a}", a, pause) for a in (0.9, 0.7, 0.5, 0.3)])
        task = tasks.load("arith", n=10, seed=4)
        return valuation.evaluate("debate", pool, task, cache_dir=cache_dir, progress=False,
                                  executor=valuation.RayExecutor(address))

    if __name__ == "__main__":
        run(sys.argv[1], sys.argv[2], 0.2)
''')


def test_driver_killed_then_rerun_plays_only_unfinished(cluster, tmp_path, monkeypatch):
    """A driver connected to the cluster by address is SIGKILLed midway; a rerun plays only the rest."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER_SCRIPT)
    cache = tmp_path / "cache"
    proc = subprocess.Popen([sys.executable, str(script), str(cache), cluster],
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)

    def results() -> list[Path]:
        return [p for p in cache.glob("*/*.json") if p.name != "meta.json"]

    deadline = time.monotonic() + 120
    while len(results()) < 4 + 2 and time.monotonic() < deadline:  # 4 individual runs, then >= 2 coalitions
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    cached = len(results())
    assert 6 <= cached < 4 + 15, "the kill must land midway"
    for p in results():
        json.loads(p.read_text())

    import importlib.util

    spec = importlib.util.spec_from_file_location("driver_script", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "driver_script", module)
    ray.cloudpickle.register_pickle_by_value(module)
    resumed = module.run(cache, None, 0.0)
    assert resumed.system_evaluations + resumed.individual_evaluations == 4 + 15 - cached
    clean = module.run(tmp_path / "clean", None, 0.0)
    assert clean.system_evaluations == 15
    for name, m in clean.measures.items():
        np.testing.assert_array_equal(resumed.measures[name].per_question, m.per_question)


@pytest.mark.slow
def test_zoo_exact_and_loo_equal_local(cluster, tmp_path):
    """The shipped zoo (HF models, rebuilt on each worker from their zoo: specs): debate on arith."""
    import agents.zoo

    task = tasks.load("arith", n=6, seed=0, **agents.zoo.TASK_OPTIONS)
    zoo = agents.pool("zoo")
    assert all(a.spec and a.spec.startswith("zoo:") for a in zoo.values())  # shipped as specs, not weights
    local = evaluate("debate", zoo, task, cache_dir=tmp_path / "local", progress=False)
    remote = evaluate("debate", zoo, task, cache_dir=tmp_path / "ray", progress=False, executor="ray")
    assert_same(local, remote)
    assert remote.system_evaluations == 31 and remote.individual_evaluations == 5
    loo = evaluate("debate", zoo, task, estimator="loo", cache_dir=tmp_path / "ray", progress=False, executor="ray")
    assert (loo.system_evaluations, loo.individual_evaluations) == (0, 0)
    np.testing.assert_array_equal(loo.loo.per_question, local.loo.per_question)
    assert valuation.CoalitionGame("debate", zoo, task, cache_dir=tmp_path / "ray").cached((1 << 5) - 1)


def test_cli_value_ray(cluster, tmp_path, capsys):
    from crl_envs.commands import main

    args = ["value", "--protocol", "debate", "--pool", "scripted", "--n", "8", "--quiet", "--out", str(tmp_path / "out")]
    assert main(args + ["--cache-dir", str(tmp_path / "local")]) == 0
    assert main(args + ["--cache-dir", str(tmp_path / "ray"), "--ray"]) == 0  # the running cluster
    local = ValuationReport.from_json(tmp_path / "out" / "debate_v0-arith-exact.json")
    capsys.readouterr()
    assert main(args + ["--ray", "127.0.0.1:1", "--no-cache"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot reach the Ray cluster at '127.0.0.1:1'" in err and len(err.splitlines()) == 1
    remote = evaluate("debate", agents.pool([ScriptedAgent.expert(f"expert-{a}", a) for a in (0.8, 0.6, 0.4)]),
                      tasks.load("arith", n=8), cache_dir=tmp_path / "ray", progress=False)
    assert (remote.system_evaluations, remote.individual_evaluations) == (0, 0)  # the CLI's Ray run filled it
    np.testing.assert_array_equal(remote.shapley.per_question, local.shapley.per_question)
