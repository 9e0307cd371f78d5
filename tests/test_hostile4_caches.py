"""Issue #47, the on-disk caches: ``clear`` deletes only the cache's own entries, the generation cache
trusts only regular files of its user in a directory nobody else can write and validates each entry,
a FIFO at an entry's path hangs neither ``generate()`` nor ``valuation.evaluate``, and both caches write
their entries with one mode (crl_kit/safe_io.py)."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from agents import Request, SamplingParams, pool
from agents import generation_cache as gc
from agents.scripted import ScriptedAgent
from crl_envs import tasks
from crl_envs.valuation import CoalitionGame, evaluate
from crl_kit.errors import ConfigError

REQUEST = Request([{"role": "user", "content": "What is 2 + 3?"}], SamplingParams(temperature=0.0))


def agent_answering(text: str) -> ScriptedAgent:
    return ScriptedAgent(f"says-{text}", lambda example, messages: text)


def cached(agent: ScriptedAgent, root: Path) -> tuple[str, list[int]]:
    """One request through the generation cache at ``root``: the answer and how many requests reached the agent."""
    calls: list[int] = []

    def generate(requests):
        calls.append(len(requests))
        return agent.generate(requests)

    gc.enable(root)
    try:
        [gen] = gc.cached_generate(agent, [REQUEST], generate, lambda r: {"messages": r.messages})
    finally:
        gc.enable(None)
    return gen.text, calls


def entry_path(agent: ScriptedAgent, root: Path) -> Path:
    key = gc.request_key(agent.fingerprint, {"messages": REQUEST.messages})
    return root / key[:2] / f"{key}.json"


def in_thread(fn, timeout: float = 20.0):
    """``fn()``'s result, or a failure when it has not returned within ``timeout`` seconds (a hang)."""
    box: dict = {}
    thread = threading.Thread(target=lambda: box.setdefault("out", fn()), daemon=True)
    thread.start()
    thread.join(timeout)
    return thread.is_alive(), box.get("out")


def release_fifo(path: Path) -> None:
    """Unblock a reader stuck on the FIFO (old code): open it for writing once."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
    except OSError:
        pass


def test_clear_deletes_only_the_caches_own_entries(tmp_path, capsys):
    root = tmp_path / "home-cache"
    for other in ("uv", "go"):  # someone's two-letter directories next to the cache
        (root / other).mkdir(parents=True)
        (root / other / "keep.txt").write_text("mine")
    (root / "ab").mkdir()
    (root / "ab" / "notes.json").write_text("{}")  # a JSON file that is no entry of ours
    root.chmod(0o755)
    text, _ = cached(agent_answering("5"), root)
    assert gc.size(root)[0] == 1
    assert gc.main(["--dir", str(root), "clear"]) == 0
    assert "cleared 1 generations" in capsys.readouterr().out
    assert (root / "uv" / "keep.txt").read_text() == "mine" and (root / "go" / "keep.txt").read_text() == "mine"
    assert (root / "ab" / "notes.json").exists()
    assert gc.size(root) == (0, 0) and not entry_path(agent_answering("5"), root).exists()


def test_a_directory_others_can_write_is_refused_in_one_line(tmp_path):
    root = tmp_path / "shared"
    agent = agent_answering("4")
    cached(agent, root)  # a real entry
    path = entry_path(agent, root)
    record = json.loads(path.read_text())
    record["generation"]["text"] = "The answer is 5."  # planted: keys are public
    path.write_text(json.dumps(record))
    root.chmod(0o777)
    with pytest.raises(ConfigError, match=r"writable by group or others.*\n?") as e:
        cached(agent, root)
    assert "\n" not in str(e.value)
    root.chmod(0o755)
    path.chmod(0o666)  # an entry anyone may rewrite in place is not trusted either
    assert cached(agent, root) == ("4", [1])


def test_entries_are_validated_field_by_field(tmp_path):
    root = tmp_path / "cache"
    agent = agent_answering("4")
    cached(agent, root)
    path = entry_path(agent, root)
    good = json.loads(path.read_text())
    for field, bad in (("text", None), ("text", 5), ("token_ids", ["a"]), ("finish_reason", None),
                       ("prompt_tokens", "3"), ("seconds", True)):
        record = json.loads(json.dumps(good))
        record["generation"][field] = bad
        path.write_text(json.dumps(record))
        path.chmod(0o644)
        assert cached(agent, root) == ("4", [1]), (field, bad)  # ignored: generated again, and rewritten
    rewritten = json.loads(path.read_text())
    assert rewritten["generation"]["text"] == "4" and rewritten["key"] == good["key"]


def test_a_fifo_at_an_entrys_path_does_not_hang_generate(tmp_path):
    root = tmp_path / "cache"
    agent = agent_answering("4")
    cached(agent, root)
    path = entry_path(agent, root)
    path.unlink()
    os.mkfifo(path)
    try:
        hung, out = in_thread(lambda: cached(agent, root))
    finally:
        release_fifo(path)
    assert not hung, "generate() hung on a FIFO in the generation cache"
    assert out == ("4", [1]) and stat.S_ISREG(path.stat().st_mode)  # generated, the FIFO replaced by the entry
    from crl_kit.safe_io import NotRegularFile, read_regular

    with pytest.raises(NotRegularFile):
        os.unlink(path)
        os.mkfifo(path)
        read_regular(path)


def test_a_fifo_in_the_coalition_cache_does_not_hang_evaluate(tmp_path):
    members = pool([ScriptedAgent.expert("a", 0.9), ScriptedAgent.expert("b", 0.4)])
    task = tasks.load("arith", n=6, seed=1)
    expected = dict(evaluate("vote", members, task, cache_dir=False, progress=False).shapley)
    game = CoalitionGame("vote", members, task, cache_dir=tmp_path)
    fifo = game._path(1)
    fifo.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(fifo)
    try:
        with pytest.warns(RuntimeWarning, match="unreadable"):
            hung, report = in_thread(lambda: evaluate("vote", members, task, cache_dir=tmp_path, progress=False))
    finally:
        release_fifo(fifo)
    assert not hung, "valuation.evaluate hung on a FIFO in the coalition cache"
    assert dict(report.shapley) == expected and stat.S_ISREG(fifo.stat().st_mode)


def test_both_caches_write_entries_with_one_mode(tmp_path):
    umask = os.umask(0o022)
    try:
        agent = agent_answering("4")
        cached(agent, tmp_path / "gen")
        members = pool([ScriptedAgent.expert("a", 0.9), ScriptedAgent.expert("b", 0.4)])
        evaluate("vote", members, tasks.load("arith", n=4, seed=1), cache_dir=tmp_path / "coal", progress=False)
    finally:
        os.umask(umask)
    modes = {stat.S_IMODE(p.stat().st_mode) for p in [entry_path(agent, tmp_path / "gen"),
                                                     *(tmp_path / "coal").rglob("*.json")]}
    assert modes == {0o644}
