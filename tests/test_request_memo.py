"""The request memo: each distinct request of a valuation generated once, with results identical to
generating every request; coalitions in lockstep; the distinct-call estimate; the on-disk cache of
``openai:`` generations."""

from __future__ import annotations

import json
import threading
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

import agents
import agents.zoo
from agents import Request, SamplingParams, ScriptedAgent
from agents import generation_cache as gc
from agents.openai import OpenAIAgent
from crl_envs import protocols, tasks, valuation
from crl_envs.runner import RequestMemo, request_key, run_coalitions, run_episodes, total_usage
from crl_envs.valuation import coalition
from crl_envs.valuation.cost import distinct_calls
from crl_envs.valuation.executors import MAX_LOCKSTEP_EPISODES, ProcessExecutor, lockstep_groups
from crl_envs.valuation.game import _run_weights

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=24)
SAMPLED = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=24)
#: coalitions over the five zoo models: shared members, different peers, one model alone
COALITIONS = [["model_0", "model_1", "model_2"], ["model_0", "model_1", "model_3"], ["model_2"]]


@pytest.fixture(scope="module")
def zoo():
    return agents.pool("zoo")


@pytest.fixture(scope="module")
def arith():
    return tasks.load("arith", n=1, seed=3, **agents.zoo.TASK_OPTIONS)


def comparable(episode) -> dict:
    """An episode without its wall seconds, the memo's own counts and its log-probs (the rest must be
    identical; log-probs differ by float noise between batch compositions, as HFAgent's always did)."""
    d = episode.to_dict()
    d["usage"] = {a: {k: v for k, v in u.items() if k not in ("seconds", "generated_calls", "generated_tokens")}
                  for a, u in d["usage"].items()}
    for turn in d["transcript"]:
        turn.pop("logprobs")
    return d


def logprobs(runs) -> list[float]:
    return [x for eps in runs for e in eps for t in e.transcript for x in t.logprobs or []]


@pytest.mark.parametrize("sampling", [GREEDY, pytest.param(SAMPLED, marks=pytest.mark.slow)], ids=["greedy", "sampled"])
@pytest.mark.parametrize("protocol", sorted(protocols.PROTOCOLS))
def test_memo_and_lockstep_give_todays_episodes(protocol, sampling, zoo, arith):
    """Every protocol, greedy and sampled: coalitions played together through a memo give exactly the
    episodes (text, token ids, log-probs, finish reasons, scores, usage) each gives alone without it."""
    ids = zoo.ids
    record = ids + ["judge", "aggregator", "router", "ranker", "fuser", "leader"]
    alone = [run_episodes(protocol, zoo, arith, coalition=c, sampling=sampling, seed=5, progress=False,
                          record=record) for c in COALITIONS]
    memo = RequestMemo()
    together = run_coalitions(protocol, zoo, arith, COALITIONS, sampling=sampling, seed=5, progress=False,
                              record=record, memo=memo)
    assert [[comparable(e) for e in eps] for eps in together] == [[comparable(e) for e in eps] for eps in alone]
    assert len(logprobs(together)) > 0 and logprobs(together) == pytest.approx(logprobs(alone), rel=1e-5, abs=1e-5)
    usage = [total_usage(eps) for eps in together]
    calls = sum(u.calls for us in usage for u in us.values())
    generated = sum(u.generated_calls for us in usage for u in us.values())
    assert calls == sum(u.calls for eps in alone for u in total_usage(eps).values())  # cost as deployed
    assert generated == memo.generated < memo.requests == calls  # every zoo model is memoised
    assert sum(u.generated_tokens for us in usage for u in us.values()) < \
        sum(u.completion_tokens for us in usage for u in us.values())


def test_memo_key_holds_everything_that_sets_the_answer():
    msgs = [{"role": "user", "content": "What is 2 + 2?"}]
    base = Request(msgs, SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=8, seed=1, stop=("\n",)))
    key = request_key("hf:a:1", base)
    assert key == request_key("hf:a:1", Request([dict(m) for m in msgs], base.sampling, metadata={"x": 1}))
    variants = [request_key("hf:a:2", base)]
    for change in ({"seed": 2}, {"temperature": 0.8}, {"top_p": 1.0}, {"max_new_tokens": 9}, {"stop": ("\n\n",)}):
        variants.append(request_key("hf:a:1", Request(msgs, SamplingParams(**{**asdict(base.sampling), **change}))))
    variants.append(request_key("hf:a:1", Request([{"role": "system", "content": "What is 2 + 2?"}], base.sampling)))
    variants.append(request_key("hf:a:1", Request([{"role": "user", "content": "What is 2 + 3?"}], base.sampling)))
    assert len({key, *variants}) == len(variants) + 1


class Counted(ScriptedAgent):
    """A scripted expert that counts the requests it generates; ``deterministic`` as a test chooses."""

    def __init__(self, name: str, accuracy: float, deterministic: bool):
        inner = ScriptedAgent.expert(name, accuracy)
        super().__init__(name, lambda ex, msgs: "")
        self.inner, self.deterministic, self.generated = inner, deterministic, 0
        self._fingerprint = f"counted:{inner.fingerprint}"

    def _generate(self, requests):
        self.generated += len(requests)
        return self.inner._generate(requests)


def test_only_deterministic_agents_are_memoised():
    task = tasks.load("arith", n=4, seed=1)
    memo = RequestMemo()
    sure = [Counted(f"d{a}", a, True) for a in (0.9, 0.6, 0.3)]
    unsure = [Counted(f"u{a}", a, False) for a in (0.9, 0.6, 0.3)]
    coalitions = [["model_0", "model_1"], ["model_0", "model_2"], ["model_0", "model_1", "model_2"]]
    played = {}
    for label, pool in (("sure", sure), ("unsure", unsure)):
        eps = run_coalitions("vote", agents.pool(pool), task, coalitions, memo=memo, progress=False)
        played[label] = [[e.score for e in c] for c in eps]
    assert [a.generated for a in unsure] == [3 * 4, 2 * 4, 2 * 4]  # every request generated
    assert [a.generated for a in sure] == [4, 4, 4]  # vote's one phase: one request per model and question
    assert played["sure"] == played["unsure"]


@pytest.mark.parametrize("entry", ["zoo", "zoo-specialists", "zoo:zoo-nocarry", "openai:http://127.0.0.1:9/v1#m",
                                   "pretrained:gemma-3-270m?backend=vllm", "vllm:some/model", "pretrained-vllm",
                                   "llamacpp:x.gguf", "pretrained-llamacpp"])
def test_the_planned_memo_reads_the_class_the_spec_builds(entry):
    """The dry run's memo rule is the runner's (``Agent.deterministic`` of the built agent's class), read
    from the backend registry before anything is built; where building is cheap, it is checked against
    the built agent's class."""
    from crl_envs.valuation.cost import memoised_models

    cls = agents.agent_class(entry)
    assert memoised_models(entry, 2) == [cls.deterministic] * 2
    if entry.startswith(("zoo", "openai")):
        built = agents.pool(entry)
        assert {type(a) for a in built.values()} == {cls}
    expected = {"zoo": "HFAgent", "openai": "OpenAIAgent", "vllm": "VLLMAgent", "llamacpp": "LlamaCppAgent"}
    assert cls.__name__ == next(v for k, v in expected.items() if k in entry)
    assert memoised_models([entry, {"expert": 0.8}], 2) == [cls.deterministic, ScriptedAgent.deterministic]


def test_agent_class_of_a_bad_entry_is_one_line():
    with pytest.raises(ValueError, match="unknown agent backend 'hff'.*did you mean 'hf'"):
        agents.agent_class("hff:gpt2")
    with pytest.raises(ValueError, match="unknown pool or malformed agent spec 'zooo'"):
        agents.agent_class("zooo")


def test_memo_drops_the_oldest_and_returns_copies():
    memo = RequestMemo(max_entries=2)
    gen = agents.Generation("a", token_ids=[1, 2])
    for k in "xyz":
        memo.put(k, gen)
    assert len(memo) == 2 and memo.get("x") is None
    got = memo.get("y")
    got.token_ids.append(3)
    assert memo.get("y").token_ids == [1, 2]
    with pytest.raises(ValueError, match="max_entries must be an int >= 1"):
        RequestMemo(max_entries=0)
    with pytest.raises(TypeError, match="memo must be a crl_envs.runner.RequestMemo"):
        run_episodes("vote", agents.pool([sure_agent()]), tasks.load("arith", n=1), memo={}, progress=False)


def sure_agent():
    return ScriptedAgent.expert("e", 1.0)


def test_valuation_with_memo_is_identical_and_caches_the_same(zoo, tmp_path, monkeypatch):
    """evaluate with and without the memo: the same report, byte-identical coalition cache files, and
    as many generations as there are distinct (model, messages, sampling) requests, counted here."""
    task = tasks.load("arith", n=2, seed=2, **agents.zoo.TASK_OPTIONS)
    sent = []
    generate = agents.HFAgent.generate

    def recording(self, requests):
        sent.extend(json.dumps([self.fingerprint, r.messages, asdict(r.sampling)]) for r in requests)
        return generate(self, requests)

    monkeypatch.setattr(agents.HFAgent, "generate", recording)
    reports, generated, made = {}, {}, {}
    for memo in (False, True):
        coalition.MEMO.clear()
        before, sent[:] = coalition.MEMO.generated, []
        reports[memo] = valuation.evaluate("debate", zoo, task, cache_dir=tmp_path / str(memo), progress=False,
                                           memo=memo)
        generated[memo], made[memo] = coalition.MEMO.generated - before, list(sent)
    for name, m in reports[False].measures.items():
        np.testing.assert_array_equal(reports[True].measures[name].per_question, m.per_question)
    off = sorted((tmp_path / "False").rglob("*.json"))
    on = sorted((tmp_path / "True").rglob("*.json"))
    assert [p.relative_to(tmp_path / "False") for p in off] == [p.relative_to(tmp_path / "True") for p in on]
    def without_seconds(path):  # a run's measured seconds differ from run to run; all else is byte-identical
        record = json.loads(path.read_text())
        assert len(record["spend"].pop("seconds")) == 2
        return json.dumps(record)

    assert all(without_seconds(a) == without_seconds(b) for a, b in zip(off, on)) and len(off) == 31 + 5
    assert generated[False] == 0 and len(made[True]) == generated[True] == len(set(made[False]))
    requests = sum(len(task) * valuation.CoalitionGame("debate", zoo, task, cache_dir=False).cost(m)
                   for m in range(1, 32)) + 5 * len(task)
    assert len(made[False]) == requests > 2 * generated[True]


def test_distinct_call_estimate_within_5_percent(zoo):
    """The dry-run's count (stand-ins, scaled) against the zoo's generations with the memo. Here on
    protocols whose shared requests do not depend on how often the models agree (on 4 questions the
    agreement is too noisy for 5%); benchmarks/valuation_memo.py compares all twelve on 30 questions."""
    task = tasks.load("arith", n=4, seed=6, **agents.zoo.TASK_OPTIONS)
    made = estimate = bar = 0.0
    for protocol in ("vote", "routing"):
        coalition.MEMO.clear()
        before = coalition.MEMO.generated
        valuation.evaluate(protocol, zoo, task, cache_dir=False, progress=False)
        made += coalition.MEMO.generated - before
        runs = [(protocol, {}, m) for m in range(1, 32)] + [("vote", {}, 1 << i) for i in range(5)]
        estimate += distinct_calls(runs, zoo.names, len(task))
        game = valuation.CoalitionGame(protocol, zoo, task, cache_dir=False, progress=False)
        alone = [] if protocol == "vote" else [(valuation.individual_game(game), 1 << i) for i in range(5)]
        bar += sum(_run_weights(alone + [(game, m) for m in range(1, 32)]).values())  # evaluate's progress bar
    assert abs(estimate - made) <= 0.05 * made, (estimate, made)
    assert bar == pytest.approx(estimate)


def test_distinct_calls_rejects_bad_runs():
    with pytest.raises(ValueError, match=r"coalition mask 8 out of range for a pool of 3 \(1\.\.7\)"):
        distinct_calls([("vote", {}, 8)], ["a", "b", "c"], 10)
    with pytest.raises(ValueError, match="each run must be"):
        distinct_calls([("vote", 1)], ["a"], 10)
    with pytest.raises(ValueError, match=r"agreement must be one rate in \[0, 1\] or one per model of the pool of 3"):
        distinct_calls([("vote", {}, 1)], ["a", "b", "c"], 10, agreement=[0.5, 0.5])


def test_lockstep_groups_respect_the_limits():
    class Game:
        def __init__(self, questions):
            self.spec = coalition.CoalitionRun(None, None, None, 1, 0, None, {}, [str(i) for i in range(questions)])

    small, big = Game(10), Game(MAX_LOCKSTEP_EPISODES // 2)
    jobs = [(small, m) for m in range(1, 8)] + [(big, m) for m in range(1, 4)]
    specs = {id(small): small.spec, id(big): big.spec}
    groups = lockstep_groups(jobs, specs, None)
    assert groups == [(id(small), list(range(7))), (id(big), [7, 8]), (id(big), [9])]
    assert [len(g) for _, g in lockstep_groups(jobs, specs, 3)] == [3, 3, 1, 2, 1]
    with pytest.raises(ValueError, match="coalitions_per_task must be an int >= 1"):
        ProcessExecutor(coalitions_per_task=0)
    with pytest.raises(ValueError, match="LocalExecutor coalitions_per_task must be an int >= 1"):
        valuation.LocalExecutor(coalitions_per_task=0)
    with pytest.raises(TypeError, match="LocalExecutor got an unexpected argument 'workers'"):
        valuation.LocalExecutor(workers=2)


def test_a_local_executor_in_small_groups_gives_the_same_numbers():
    pool = agents.pool([agents.ScriptedAgent.expert(f"e{a}", a, seed=3) for a in (0.9, 0.6, 0.4)])
    task = tasks.load("arith", n=6, seed=1)
    whole = valuation.evaluate("debate", pool, task, cache_dir=False, progress=False)
    small = valuation.evaluate("debate", pool, task, cache_dir=False, progress=False,
                               executor=valuation.LocalExecutor(coalitions_per_task=2))
    for name, m in whole.measures.items():
        np.testing.assert_array_equal(small.measures[name].per_question, m.per_question)
    np.testing.assert_array_equal(small.system, whole.system)


@pytest.mark.slow
def test_processes_in_lockstep_groups_equal_local(zoo, tmp_path):
    task = tasks.load("arith", n=2, seed=2, **agents.zoo.TASK_OPTIONS)
    local = valuation.evaluate("moa", zoo, task, cache_dir=False, progress=False)
    spread = valuation.evaluate("moa", zoo, task, cache_dir=False, progress=False,
                                executor=ProcessExecutor(workers=2, coalitions_per_task=4))
    for name, m in local.measures.items():
        np.testing.assert_array_equal(spread.measures[name].per_question, m.per_question)


# ---------------------------------------------------------------------- the on-disk cache of openai: agents
class Chat(BaseHTTPRequestHandler):
    bodies: list = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Chat.bodies.append(body)
        text = f"echo {body['messages'][-1]['content']} seed={body.get('seed')} n={len(Chat.bodies)}"
        data = json.dumps({"choices": [{"message": {"content": text}, "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": 3, "completion_tokens": 4}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Chat)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    Chat.bodies = []
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()


def test_openai_generation_cache_is_off_by_default_then_reuses_and_clears(server, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(gc.ENV, raising=False)
    agent = OpenAIAgent(server, "m")
    ask = [Request([{"role": "user", "content": "q1"}], SamplingParams(seed=7)),
           Request([{"role": "user", "content": "q2"}], SamplingParams(temperature=1.0)),  # unseeded: never cached
           Request([{"role": "user", "content": "q1"}], SamplingParams(seed=8))]
    agent.generate(ask)
    assert len(Chat.bodies) == 3 and gc.directory() is None
    monkeypatch.setenv(gc.ENV, str(tmp_path / "gen"))
    first = agent.generate(ask)
    again = agent.generate(ask)
    assert len(Chat.bodies) == 3 + 3 + 1  # the second time only the unseeded request reached the server
    assert [g.text for g in again][::2] == [g.text for g in first][::2] and again[1].text != first[1].text
    assert gc.size()[0] == 2
    other = OpenAIAgent(server, "m", extra_body={"top_k": 5}).generate(ask[:1])  # another body: another key
    assert other[0].text.endswith(f"n={len(Chat.bodies)}") and gc.size()[0] == 3
    key = gc.request_key(agent.fingerprint, agent.payload(ask[0]))
    path = tmp_path / "gen" / key[:2] / f"{key}.json"  # an entry whose body does not match is not read
    record = json.loads(path.read_text())
    record["body"]["messages"][0]["content"] = "tampered"
    path.write_text(json.dumps(record))
    agent.generate(ask[:1] + ask[2:])
    assert len(Chat.bodies) == 3 + 3 + 1 + 1 + 1  # q1 seed 7 asked again (and stored again), q1 seed 8 read
    assert gc.main(["size"]) == 0 and "3 generations" in capsys.readouterr().out
    assert gc.main(["clear"]) == 0 and "cleared 3 generations" in capsys.readouterr().out
    assert gc.size() == (0, 0)


def test_a_greedy_only_memo_asks_a_greedy_member_once_for_all_samples_and_leaves_sampled_requests_alone(zoo, arith):
    """``RequestMemo(greedy_only=True)`` (a trainer's rollouts): a greedy member's answer to a question is generated
    once for all its samples (the seed does not reach an argmax), a sampled member's every time; the episodes are
    those played without a memo. A memo that keys on the seed reuses nothing here."""
    sampling = {a: GREEDY for a in zoo.ids} | {"model_0": SAMPLED}
    kwargs = dict(samples=4, seed=5, sampling=sampling, progress=False)
    plain = run_episodes("vote", zoo, arith, **kwargs)
    memo = RequestMemo(greedy_only=True)
    memoised = run_episodes("vote", zoo, arith, memo=memo, **kwargs)
    assert [comparable(e) for e in memoised] == [comparable(e) for e in plain]
    usage = total_usage(memoised)
    assert usage["model_0"].generated_calls == 4  # sampled: every sample generated
    assert {usage[a].generated_calls for a in zoo.ids if a != "model_0"} == {1}  # greedy: once per question
    assert (memo.requests, memo.generated) == (4 * (len(zoo.ids) - 1), len(zoo.ids) - 1)  # sampled ones never seen
    seeded = RequestMemo()
    run_episodes("vote", zoo, arith, memo=seeded, **kwargs)
    assert seeded.generated == seeded.requests == 4 * len(zoo.ids)  # each sample's greedy request has its own seed
    request = Request([{"role": "user", "content": "What is 2 + 2?"}], GREEDY.with_seed(1))
    other_seed = Request(request.messages, GREEDY.with_seed(2))
    assert memo.key("f", request) == memo.key("f", other_seed) and seeded.key("f", request) != seeded.key("f", other_seed)
    assert memo.admits(request) and not memo.admits(Request(request.messages, SAMPLED.with_seed(1)))
