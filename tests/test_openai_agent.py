"""OpenAIAgent against a real HTTP server on loopback, with injected faults.

The server answers each chat request with a text computed from the request (its last message and
seed), so the tests can check every answer and its order. A fault plan decides, per request and
attempt, whether to answer with a 500, a 429 with Retry-After, a timeout, malformed JSON or a
connection dropped mid-response.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import random
import socket
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import agents
import crl_envs
from agents import HFAgent, Request, SamplingParams
from agents.openai import OpenAIAgent, OpenAIRequestError, backoff_delay, parse_openai_spec, parse_retry_after
from crl_envs.tasks import Example

FAULTS = ("500", "429", "timeout", "malformed", "drop")
#: The client's timeout per attempt. Only a hung server reaches it: a test whose attempts could time out on
#: a slow machine would count attempts by the machine's speed (an attempt the server had not yet handled when
#: the client gave up was missing from its count, under load).
CLIENT_TIMEOUT = 30.0
#: With "timeout" faults: the stalled attempts wait until the server closes, so they always time out; the
#: answered ones have 1 s with up to 4 requests in flight (at a load average of 13 on 2 cores the slowest of 60
#: took 70 ms) and 2 s with 16 (428 ms of 240).
TIMEOUT_FAULT_CLIENT_TIMEOUT = 1.0
TIMEOUT_FAULT_CLIENT_TIMEOUT_16 = 2.0


def expected_answer(content: str, seed: int | None) -> str:
    return f"answer<{content[::-1]}|{seed}>"


def canned_response(body: dict) -> dict:
    text = expected_answer(body["messages"][-1]["content"], body.get("seed"))
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
    if body.get("logprobs"):
        choice["logprobs"] = {
            "content": [{"token": f"token_id:{ord(c)}", "logprob": -0.5 * (i + 1)} for i, c in enumerate("abc")]
        }
    usage = {"prompt_tokens": len(body["messages"][-1]["content"]), "completion_tokens": len(text)}
    return {"choices": [choice], "usage": usage}


class ChatServer:
    """A chat-completions server in a thread. ``fault(key, attempt)`` returns a fault name or None."""

    def __init__(
        self,
        fault: Callable[[str, int], str | None] = lambda key, attempt: None,
        retry_after: str = "0",
        respond: Callable[[dict], dict] | None = None,
        latency: float = 0.0,
    ):
        self.fault = fault
        self.latency = latency  # seconds before a request is read: a server starved by a loaded machine
        self.respond = respond or canned_response
        self.retry_after = retry_after
        self.attempts: Counter[str] = Counter()
        self.injected: Counter[str] = Counter()
        self.bodies: list[dict] = []
        self.headers: list[dict[str, str]] = []
        self.lock = threading.Lock()
        self.closing = threading.Event()  # releases the stalled ("timeout") handlers
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                if server.latency:
                    time.sleep(server.latency)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                key = body["messages"][-1]["content"]
                with server.lock:
                    attempt = server.attempts[key]
                    server.attempts[key] += 1
                    server.bodies.append(body)
                    server.headers.append(dict(self.headers))
                    kind = server.fault(key, attempt)
                    if kind:
                        server.injected[kind] += 1
                if kind == "500":
                    self._send(500, f"internal error (auth was {self.headers.get('Authorization')})".encode())
                elif kind == "400":
                    self._send(400, b'{"error": "bad request: unknown field"}')
                elif kind == "429":
                    self._send(429, b'{"error": "rate limited"}', {"Retry-After": server.retry_after})
                elif kind == "malformed":
                    self._send(200, b'{"choices": [{"message": ')
                elif kind == "null_content":
                    self._send(200, json.dumps({"choices": [{"message": {"content": None}, "finish_reason": "stop"}]}).encode())
                elif kind == "drop":
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", "5000")
                    self.end_headers()
                    self.wfile.write(b'{"choices": [{"mess')
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                else:
                    if kind == "timeout":
                        server.closing.wait()  # longer than any client timeout: until the server closes
                    self._answer(body)

            def _answer(self, body):
                try:
                    self._send(200, json.dumps(server.respond(body)).encode())
                except OSError:  # the client gave up (timeout fault)
                    self.close_connection = True

            def _send(self, status, payload, headers=None):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(payload)

        class Server(ThreadingHTTPServer):
            request_queue_size = 256  # the default 5 drops connections beyond it (the client resends after 1 s)

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ChatServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def make_agent(url: str, **kw) -> OpenAIAgent:
    """An agent on ``url``; pass ``timeout=TIMEOUT_FAULT_CLIENT_TIMEOUT`` where the server stalls."""
    options = dict(timeout=CLIENT_TIMEOUT, backoff_base=0.01, backoff_max=0.05, max_retries=4, concurrency=8)
    options.update(kw)
    return OpenAIAgent(url, "canned-model", name="canned", **options)


def client_timeout(fault: str) -> float:
    return TIMEOUT_FAULT_CLIENT_TIMEOUT if fault == "timeout" else CLIENT_TIMEOUT


def make_requests(n: int, prefix: str = "q") -> list[Request]:
    return [
        Request(
            messages=[{"role": "user", "content": f"{prefix}{i}"}],
            sampling=SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=32, seed=1000 + i),
            metadata={"example": Example(id=f"{prefix}-ex-{i}", question=f"{prefix}{i}", answer="0")},
        )
        for i in range(n)
    ]


def test_answers_in_order_with_sampling_fields_and_usage():
    with ChatServer() as server:
        requests = make_requests(20)
        gens = make_agent(server.url, concurrency=4).generate(requests)
    assert [g.text for g in gens] == [expected_answer(f"q{i}", 1000 + i) for i in range(20)]
    body = next(b for b in server.bodies if b["messages"][-1]["content"] == "q3")
    assert body["model"] == "canned-model"
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["seed"], body["n"]) == (0.7, 0.9, 32, 1003, 1)
    assert "logprobs" not in body
    assert gens[12].prompt_tokens == len("q12") and gens[12].completion_tokens == len(gens[12].text)
    assert all(g.finish_reason == "stop" and g.logprobs is None for g in gens)


def test_logprobs_and_token_ids_when_requested():
    with ChatServer() as server:
        gen = make_agent(server.url, logprobs=True).generate(make_requests(1))[0]
    assert server.bodies[0]["logprobs"] is True
    assert gen.logprobs == [-0.5, -1.0, -1.5]
    assert gen.token_ids == [ord("a"), ord("b"), ord("c")]


def test_api_key_sent_as_bearer_and_never_shown(monkeypatch):
    secret = "sk-test-Zq81secret"
    monkeypatch.setenv("CRL_TEST_API_KEY", secret)
    with ChatServer(fault=lambda key, attempt: "500" if key == "q1" else None) as server:
        agent = make_agent(server.url, api_key_env="CRL_TEST_API_KEY", max_retries=1)
        assert secret not in repr(agent) and secret not in str(vars(agent))
        agent.generate(make_requests(1))  # q0 succeeds
        with pytest.raises(OpenAIRequestError) as info:
            agent.generate(make_requests(2))
    assert all(h.get("Authorization") == f"Bearer {secret}" for h in server.headers)
    shown = "".join(traceback.format_exception(info.value))
    assert "HTTP 500" in shown and "auth was Bearer ***" in shown
    assert secret not in shown


@pytest.mark.parametrize("fault", FAULTS)
def test_transient_fault_is_retried(fault):
    with ChatServer(fault=lambda key, attempt: fault if attempt < 2 else None) as server:
        gens = make_agent(server.url, timeout=client_timeout(fault)).generate(make_requests(3))
    assert [g.text for g in gens] == [expected_answer(f"q{i}", 1000 + i) for i in range(3)]
    assert all(server.attempts[f"q{i}"] == 3 for i in range(3))
    assert server.injected[fault] == 6


@pytest.mark.parametrize(
    "fault, shown",
    [("500", "HTTP 500"), ("429", "HTTP 429"), ("timeout", "timed out"), ("malformed", "malformed JSON"),
     ("drop", "connection error"), ("null_content", "malformed chat-completions response")],
)
def test_persistent_fault_is_surfaced_with_agent_and_example(fault, shown):
    with ChatServer(fault=lambda key, attempt: fault if key == "q2" else None) as server:
        with pytest.raises(OpenAIRequestError) as info:
            make_agent(server.url, max_retries=2, timeout=client_timeout(fault)).generate(make_requests(4))
    message = str(info.value)
    assert "'canned'" in message and "'q-ex-2'" in message and "3 attempts" in message and shown in message
    assert server.attempts["q2"] == 3


def test_a_slow_server_changes_no_attempt_count():
    """What made ``[429]`` above fail under load (``attempts == 2``): with a 0.2 s client timeout, an
    attempt the server had not yet read timed out and was missing from its count. A server that takes
    0.3 s per request now gets the same count and failure as a fast one."""
    with ChatServer(fault=lambda key, attempt: "429" if key == "q1" else None, latency=0.3) as server:
        with pytest.raises(OpenAIRequestError, match=r"'q-ex-1' failed after 3 attempts; last failure: HTTP 429"):
            make_agent(server.url, max_retries=2).generate(make_requests(2))
    assert server.attempts["q1"] == 3 and server.injected["429"] == 3


def test_client_error_is_not_retried():
    with ChatServer(fault=lambda key, attempt: "400") as server:
        with pytest.raises(OpenAIRequestError, match="HTTP 400.*bad request") as info:
            make_agent(server.url).generate(make_requests(1))
    assert server.attempts["q0"] == 1 and "1 attempt;" in str(info.value)


def test_retry_after_is_honoured():
    with ChatServer(fault=lambda key, attempt: "429" if attempt == 0 else None, retry_after="1") as server:
        t0 = time.perf_counter()
        gen = make_agent(server.url, backoff_base=0.001).generate(make_requests(1))[0]
        elapsed = time.perf_counter() - t0
    assert gen.text == expected_answer("q0", 1000)
    assert elapsed >= 0.95, f"retried after {elapsed:.3f}s, before the server's Retry-After: 1"


def test_parse_retry_after_seconds_and_http_date():
    now = time.time()
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("0.25") == 0.25
    assert parse_retry_after(email.utils.formatdate(now + 30, usegmt=True), now=now) == pytest.approx(30, abs=1)
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None


def test_backoff_grows_exponentially_with_jitter_and_cap():
    rng = random.Random(0)
    for attempt in range(8):
        ceiling = min(1.0, 0.01 * 2**attempt)
        delays = [backoff_delay(attempt, 0.01, 1.0, rng) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 1


def test_200_requests_with_20_percent_transient_faults():
    def fault(key: str, attempt: int) -> str | None:
        rng = random.Random(f"{key}/{attempt}")
        return rng.choice(FAULTS) if rng.random() < 0.2 else None

    with ChatServer(fault=fault) as server:
        requests = make_requests(200, prefix="m")
        agent = make_agent(server.url, concurrency=16, max_retries=8, timeout=TIMEOUT_FAULT_CLIENT_TIMEOUT_16)
        gens = agent.generate(requests)
    assert [g.text for g in gens] == [expected_answer(f"m{i}", 1000 + i) for i in range(200)]
    total_faults = sum(server.injected.values())
    assert total_faults >= 25 and set(server.injected) == set(FAULTS), server.injected
    assert sum(server.attempts.values()) == 200 + total_faults


def test_generate_inside_a_running_event_loop():
    with ChatServer() as server:
        agent = make_agent(server.url)

        async def main():
            return agent.generate(make_requests(3))

        gens = asyncio.run(main())
    assert [g.text for g in gens] == [expected_answer(f"q{i}", 1000 + i) for i in range(3)]


def test_spec_strings():
    agent = agents.from_spec("openai:http://127.0.0.1:8000/v1#Qwen/Qwen2.5-0.5B?concurrency=3&logprobs=true")
    assert isinstance(agent, OpenAIAgent)
    assert (agent.base_url, agent.model, agent.concurrency, agent.logprobs) == (
        "http://127.0.0.1:8000/v1", "Qwen/Qwen2.5-0.5B", 3, True)
    assert parse_openai_spec("https://api.example.com/v1/#gpt") == ("https://api.example.com/v1/", "gpt", {})
    with pytest.raises(ValueError, match="expected 'openai:<base url>#<model>'"):
        agents.from_spec("openai:http://127.0.0.1:8000/v1")
    with pytest.raises(ValueError, match="unknown openai spec option 'concurency'"):
        agents.from_spec("openai:http://h/v1#m?concurency=3")
    with pytest.raises(ValueError, match="must start with http"):
        agents.from_spec("openai:127.0.0.1:8000#m")
    with pytest.raises(ValueError, match="concurrency must be >= 1"):
        OpenAIAgent("http://h/v1", "m", concurrency=0)


def hf_backed_response(agent: HFAgent) -> Callable[[dict], dict]:
    """Serve an HFAgent the way vLLM serve answers (ids in logprob tokens, token_ids, usage)."""
    lock = threading.Lock()

    def respond(body: dict) -> dict:
        request = Request(body["messages"], SamplingParams(
            temperature=body["temperature"], top_p=body["top_p"], max_new_tokens=body["max_tokens"], seed=body.get("seed")))
        with lock:
            g = agent.generate([request])[0]
        choice = {"index": 0, "message": {"role": "assistant", "content": g.text}, "finish_reason": g.finish_reason,
                  "token_ids": g.token_ids}
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": f"token_id:{t}", "logprob": lp}
                                              for t, lp in zip(g.token_ids, g.logprobs)]}
        usage = {"prompt_tokens": g.prompt_tokens, "completion_tokens": g.completion_tokens}
        return {"choices": [choice], "usage": usage, "prompt_token_ids": g.prompt_token_ids}

    return respond




def test_runner_through_a_server_matches_the_model_played_directly(tiny_model_dir, arith_task, one_thread):
    hf = HFAgent(tiny_model_dir, name="tiny")
    options = dict(examples=[0, 1, 2], samples=2, seed=5, sampling=SamplingParams(temperature=1.0, max_new_tokens=10),
                   record=["model_0", "model_1"], progress=False)
    direct = crl_envs.run_episodes("debate", [hf, hf], arith_task, **options)
    with ChatServer(respond=hf_backed_response(hf), fault=lambda key, attempt: "500" if attempt == 0 else None) as server:
        served = [make_agent(server.url, timeout=30, seed_bits=63, logprobs=True, token_ids=True) for _ in range(2)]
        remote = crl_envs.run_episodes("debate", served, arith_task, **options)
    assert len(remote) == len(direct) == 6
    for a, b in zip(direct, remote):
        assert [t.text for t in a.transcript] == [t.text for t in b.transcript]
        assert [t.token_ids for t in a.transcript] == [t.token_ids for t in b.transcript]
        assert [t.prompt_token_ids for t in a.transcript] == [t.prompt_token_ids for t in b.transcript]
        for ta, tb in zip(a.transcript, b.transcript):
            assert ta.logprobs == pytest.approx(tb.logprobs, abs=1e-6)
        assert a.score == b.score
        for agent_id in ("model_0", "model_1"):
            ua, ub = a.usage[agent_id], b.usage[agent_id]
            assert (ua.calls, ua.prompt_tokens, ua.completion_tokens) == (ub.calls, ub.prompt_tokens, ub.completion_tokens)
            assert ub.seconds > 0
    totals = crl_envs.total_usage(remote)
    assert totals["model_0"].completion_tokens == sum(
        len(t.token_ids) for e in remote for t in e.transcript if t.agent == "model_0")


def test_stop_strings_are_sent_and_the_answer_ends_before_them():
    """A server that returns the stop string in the text (transformers serve does) or ignores ``stop``:
    the answer still ends before it, finish reason "stop"."""

    def respond(body: dict) -> dict:
        text = "The answer is 4.\nUser: and 5+5?"
        return {"choices": [{"message": {"content": text}, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 12}}

    with ChatServer(respond=respond) as server:
        request = Request([{"role": "user", "content": "2+2?"}], SamplingParams(stop=["\nUser:", "never"]))
        cut, plain = make_agent(server.url).generate([request, Request([{"role": "user", "content": "2+2?"}])])
    # the two requests are in flight together: they reach the server in either order
    assert len(server.bodies) == 2 and [b["stop"] for b in server.bodies if "stop" in b] == [["\nUser:", "never"]]
    assert (cut.text, cut.finish_reason) == ("The answer is 4.", "stop")
    assert (plain.text, plain.finish_reason) == ("The answer is 4.\nUser: and 5+5?", "length")
    assert cut.completion_tokens == 12  # usage is what the server counted (and billed)


def pieces_response(pieces: list[str], text: str, with_bytes: bool) -> Callable[[dict], dict]:
    """A server whose text ends where it found a stop string but whose log-probs run on through the
    tokens that wrote it (vLLM and llama.cpp keep those tokens)."""

    def respond(body: dict) -> dict:
        entries = [{"token": p, "logprob": -0.1 * (i + 1), **({"bytes": list(p.encode())} if with_bytes else {})}
                   for i, p in enumerate(pieces)]
        return {"choices": [{"message": {"content": text}, "finish_reason": "stop", "logprobs": {"content": entries}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": len(pieces)}}

    return respond


@pytest.mark.parametrize("with_bytes", [True, False])
def test_logprobs_are_cut_where_the_answer_ends(with_bytes):
    stop = SamplingParams(stop=["\nUser:"])
    cases = [  # (tokens, text from the server, expected text, expected number of kept log-probs)
        (["The", " answer", " is", " 4", ".", "\n", "User", ":"], "The answer is 4.", "The answer is 4.", 5),
        # the stop string begins inside a token (".\n"): that token goes, with its "." (as HFAgent cuts)
        (["The", " answer", " is", " 4", ".\n", "User", ":"], "The answer is 4.", "The answer is 4", 4),
        (["Caf", "é", " 4"], "Café 4", "Café 4", 3),  # nothing past the answer: nothing cut
    ]
    for tokens, server_text, text, kept in cases:
        with ChatServer(respond=pieces_response(tokens, server_text, with_bytes)) as server:
            gen = make_agent(server.url, logprobs=True).generate([Request([{"role": "user", "content": "q"}], stop)])[0]
        assert server.bodies[0]["logprobs"] is True and server.bodies[0]["top_logprobs"] == 0
        assert gen.text == text and gen.finish_reason == "stop"
        assert gen.logprobs == pytest.approx([-0.1 * (i + 1) for i in range(kept)])


def test_missing_logprobs_fail_at_once_naming_the_agent():
    """transformers serve answers ``logprobs: true`` without any: that must never reach a trainer as None."""
    with ChatServer(respond=lambda body: {"choices": [{"message": {"content": "4"}, "finish_reason": "stop"}]}) as server:
        with pytest.raises(OpenAIRequestError) as info:
            make_agent(server.url, logprobs=True, max_retries=3).generate(make_requests(2))
        attempts = server.attempts["q0"]
        assert make_agent(server.url).generate(make_requests(1))[0].logprobs is None  # not asked: fine
    message = str(info.value)
    assert "'canned'" in message and "'q-ex-0'" in message and "1 attempt;" in message
    assert "without the log-probs" in message and "logprobs=false" in message
    assert attempts == 1  # not retried: the server will never send them


def test_the_error_names_the_first_failing_request_in_request_order_not_the_first_to_fail():
    """Request 1 fails at once, request 0 a moment later: the error names request 0 (the verdict of a
    batch must not depend on which request the scheduler finished first)."""

    def respond(body):
        if body["messages"][-1]["content"] == "q0":
            time.sleep(0.5)
        return {"choices": [{"message": {"content": "4"}, "finish_reason": "stop"}]}  # no log-probs

    with ChatServer(respond=respond) as server:
        with pytest.raises(OpenAIRequestError, match=r"example 'q-ex-0' failed after 1 attempt;"):
            make_agent(server.url, logprobs=True).generate(make_requests(3))
    assert server.attempts["q0"] == 1 and server.attempts["q1"] == 1


def test_a_refused_connection_fails_fast_naming_the_base_url_and_the_request():
    """No server on the port: a short bounded retry (not the backoff meant for a busy server), then one
    line naming the base URL, the fix and the request (by its place in the batch when it has no example)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    url = f"http://127.0.0.1:{port}/v1"
    agent = OpenAIAgent(url, "m", name="closed")  # the default retries and backoff
    t0 = time.perf_counter()
    with pytest.raises(OpenAIRequestError) as info:
        agent.generate([Request([{"role": "user", "content": f"q{i}"}]) for i in range(4)])
    elapsed = time.perf_counter() - t0
    message = str(info.value)
    assert elapsed < 5, f"a refused connection took {elapsed:.1f} s to surface"
    assert "\n" not in message and f"is a server running at {url}?" in message and "fix the base URL" in message
    assert "request 1 of 4 (no task example) failed after 3 attempts" in message and "None" not in message


def test_a_server_that_answered_then_refuses_gets_every_retry():
    """A refusal from a server that has answered before is a restart, not a wrong URL: the agent keeps
    its full retry budget (the fast path above is only for servers it never reached)."""
    with ChatServer() as server:
        agent = make_agent(server.url, max_retries=4, backoff_base=0.05, backoff_max=0.1)
        assert agent.generate(make_requests(1))[0].text
    with pytest.raises(OpenAIRequestError, match=r"failed after 5 attempts; last failure: connection error"):
        agent.generate(make_requests(1))
