"""Structured interaction over a graph: R rounds, each member seeing only its in-neighbours' last answers.

| | |
|---|---|
| Import | ``crl_envs.topology_v0(pool, task, graph="chain", rounds=2)`` |
| Family | text exchange (MoCo's text level) |
| Agents | the coalition's members (``model_0 .. model_{n-1}``) |
| Phases | ``rounds`` steps: ``round_1`` every member answers alone; ``round_k`` (k > 1) every member sees its own previous answer and its present in-neighbours' previous answers, and answers again |
| Observation | ``{"prompt": str}`` the rendered chat transcript; ``infos[a]["messages"]`` the chat messages |
| Action | ``str``, the answer text (truncated to ``max_action_chars``) |
| Reward | 0 until the end; then every agent gets the system's score in [0, 1] |
| System answer | plurality of the last round's extracted answers; ties go to the tied answer first given in pool order |
| Final infos | ``answer``, ``score``, ``answers`` (last round, per member), ``standalone`` (round-1 correctness per member) |
| Arguments | ``graph``, ``rounds`` (>= 1, default 2), ``prompts``, ``max_action_chars``, ``render_mode`` |

``graph`` is over pool indices: a name — ``"chain"`` (i — i+1), ``"star"`` (``model_0`` is the hub,
linked to every other model), ``"tree"`` (binary: i — (i-1)//2), ``"ring"`` (chain plus last — first),
``"complete"`` (all pairs); named graphs are undirected — or an ``n x n`` 0/1 adjacency matrix where
``graph[i][j] = 1`` means i's answer reaches j (directed; the diagonal is ignored).

**Masked nodes:** the coalition plays the subgraph induced by its present members: every edge to or
from a masked node disappears and nothing is relayed through it (a chain 0-1-2 without 1 leaves 0
and 2 unlinked). A member with no present in-neighbour refines its own answer (template ``refine``).
Neighbours are shown as "Agent 1", "Agent 2", ... in pool order among the present in-neighbours.

Coalition semantics

| coalition | meaning |
|---|---|
| 1 member | self-refinement: each later round shows the member only its own previous answer |
| 0 members | v(∅) = 0 |

Version history: v0 — initial release.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from crl_envs import roster
from crl_envs.protocols.debate import DebateEnv
from crl_kit.errors import ConfigError

GRAPHS = ("chain", "star", "tree", "ring", "complete")


def adjacency(graph: str | Sequence[Sequence[int]] | np.ndarray, n: int) -> np.ndarray:
    """The ``n x n`` boolean adjacency (``[i, j]``: i's answer reaches j) of a named graph or a matrix.

    Example:
        >>> adjacency("chain", 3).astype(int).tolist()
        [[0, 1, 0], [1, 0, 1], [0, 1, 0]]
    """
    a = np.zeros((n, n), dtype=bool)
    if isinstance(graph, str):
        if graph not in GRAPHS:
            raise ConfigError(f"unknown topology graph {graph!r}; names are {GRAPHS}, or pass an n x n adjacency matrix")
        if graph in ("chain", "ring"):
            pairs = [(i, i + 1) for i in range(n - 1)] + ([(n - 1, 0)] if graph == "ring" and n > 2 else [])
        elif graph == "star":
            pairs = [(0, i) for i in range(1, n)]
        elif graph == "tree":
            pairs = [((i - 1) // 2, i) for i in range(1, n)]
        else:
            pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
        for i, j in pairs:
            a[i, j] = a[j, i] = True
        return a
    m = np.asarray(graph)
    if m.shape != (n, n) or not np.isin(m, (0, 1)).all():
        raise ConfigError(f"topology adjacency must be an {n} x {n} matrix of 0/1 (one row and column per pool "
                         f"model), got shape {m.shape}")
    a[:] = m.astype(bool)
    np.fill_diagonal(a, False)
    return a


class TopologyEnv(DebateEnv):
    """Debate restricted to a graph: ``peers_of`` follows the edges (on ``"complete"`` it is debate)."""

    metadata = {"name": roster.versioned("topology"), "render_modes": ["human"], "is_parallelizable": True}
    FAMILY = "text exchange"
    PROMPTS = {
        "answer": "{question}",
        "update": "{question}\n{peers}\nYour previous answer: {own}\nConsidering these answers, give your updated answer.",
        "refine": "{question}\nYour previous answer: {own}\nReview it and give your final answer.",
    }
    empty_value = 0.0
    REVISE_TEMPLATE = "update"

    def __init__(self, pool, task, *, graph: str | Sequence[Sequence[int]] | np.ndarray = "chain", rounds: int = 2,
                 **kwargs):
        if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
            raise ConfigError(f"topology rounds must be an int >= 1, got {rounds!r}")
        super().__init__(pool, task, rounds=rounds, **kwargs)
        self.graph = graph if isinstance(graph, str) else np.asarray(graph).tolist()
        self.adjacency = adjacency(graph, len(self.pool))

    def coalition_context(self, members: Sequence[str]) -> list[list[int]]:
        """The graph among ``members`` (a ring's closing edge, a matrix's rows depend on the whole pool)."""
        index = [self.pool.ids.index(a) for a in members]
        return [[int(self.adjacency[i, j]) for j in index] for i in index]

    def peers_of(self, agent: str) -> list[str]:
        """Present members whose answers reach ``agent`` along the graph's edges (pool order)."""
        j = self.pool.ids.index(agent)
        return [b for b in self.members if self.adjacency[self.pool.ids.index(b), j]]


def env(pool, task, **options) -> TopologyEnv:
    """Make a ``topology_v0`` env (see the module docstring for options)."""
    return TopologyEnv(pool, task, **options)
