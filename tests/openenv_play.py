"""Serve the learner's seat with whichever OpenEnv is installed and play episodes with its own client.

Run as ``python tests/openenv_play.py SPEC.json`` by ``tests/test_openenv_current.py`` inside an environment of
its own (the current ``openenv`` release cannot share the suite's environment). SPEC names the game
(``protocol``, ``pool``, ``task`` and its ``task_options``, ``learner``, ``options``) and the ``plays``:
``[[index, [message, ...]], ...]``, played concurrently, one OpenEnv session each: each play looks its
question up through OpenEnv 0.10's Task API (``/{env_name}/task``) and resets on its id. Prints one JSON
object: the OpenEnv version, the splits and task count the Task API lists, the
state's fields ``/schema`` publishes, the status codes of two bad task requests (an index out of
range, an unknown split) and, per play, the task spec,
the contexts the client saw, the final ``reward`` and ``done``, and the session's state.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor


def _serve(app) -> tuple[str, object, threading.Thread]:
    import socket

    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the OpenEnv server did not start")
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}", server, thread


def _play(url: str, env_name: str, split: str, index: int, texts: list[str]) -> dict:
    import httpx
    from openenv.core import GenericEnvClient

    response = httpx.post(f"{url}/{env_name}/task", json={"split": split, "index": index}, timeout=60)
    response.raise_for_status()
    task = response.json()["task"]
    example_id = task["id"]
    contexts = []
    with GenericEnvClient(base_url=url).sync() as env:
        result = env.reset(example_id=example_id)
        for text in texts:
            if result.done:
                break
            contexts.append(result.observation["context"])
            result = env.step({"message": text})
        state = env.state()
    state = state if isinstance(state, dict) else state.model_dump()
    return {"task": task, "contexts": contexts, "reward": result.reward, "done": result.done,
            "state": state}


def main(spec_path: str) -> None:
    import agents
    from crl_envs import tasks
    from crl_envs.integrations.openenv_compat import openenv_release
    from crl_envs.integrations.openenv_server import create_collaboration_app

    spec = json.loads(open(spec_path).read())
    task = tasks.load(spec["task"], **spec.get("task_options", {}))
    app = create_collaboration_app(spec["protocol"], agents.pool(spec["pool"]), task, spec["learner"],
                                   options=spec.get("options"), max_concurrent_envs=max(2, len(spec["plays"])))
    url, server, thread = _serve(app)
    try:
        import httpx

        env_name = httpx.get(f"{url}/list_environments", timeout=60).json()[0]
        splits = httpx.get(f"{url}/{env_name}/splits", timeout=60).json()
        split = splits[0]["name"]
        state_fields = sorted(httpx.get(f"{url}/schema", timeout=60).json()["state"]["properties"])
        count = httpx.post(f"{url}/{env_name}/num_tasks", json={"split": split}, timeout=60).json()["num_tasks"]
        refused = [httpx.post(f"{url}/{env_name}/task", json=bad, timeout=60).status_code
                   for bad in ({"split": split, "index": count}, {"split": "no-such-split", "index": 0})]
        with ThreadPoolExecutor(len(spec["plays"])) as workers:
            plays = list(workers.map(lambda play: _play(url, env_name, split, *play), spec["plays"]))
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    print(json.dumps({"openenv": openenv_release(), "env_name": env_name, "splits": splits, "num_tasks": count,
                      "state_fields": state_fields, "refused": refused, "plays": plays}))


if __name__ == "__main__":
    main(sys.argv[1])
