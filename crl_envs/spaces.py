"""Gymnasium spaces for text observations and actions.

``gymnasium.spaces.Text`` rejects most of what models write (its default charset is alphanumeric
and ``min_length`` is 1), so :class:`TextSpace` accepts *any* ``str`` up to ``max_length``
characters while sampling from printable ASCII.

Example:
    >>> from crl_envs.spaces import TextSpace
    >>> space = TextSpace(max_length=20)
    >>> space.contains("Héllo — world!"), space.contains(""), space.contains("x" * 21), space.contains(3)
    (True, True, False, False)
"""

from __future__ import annotations

import functools
import numbers
import string
from typing import Any

from gymnasium import spaces

from crl_kit.errors import ConfigError, ConfigTypeError

SAMPLE_CHARSET = string.ascii_letters + string.digits + string.punctuation + " "


class TextSpace(spaces.Text):
    """Any Python string of at most ``max_length`` characters (``min_length`` 0).

    Every env builds one per agent and episode, so the charset's tables (``gymnasium.spaces.Text`` builds them
    per instance, ~40 us) are built once and shared: they are never changed after construction. Each space
    keeps its own random generator."""

    def __init__(self, max_length: int, *, seed: int | None = None):
        if isinstance(max_length, bool) or not isinstance(max_length, numbers.Integral):
            raise ConfigTypeError(f"max_length must be an int, got {type(max_length).__name__} {max_length!r}")
        if max_length < 1:
            raise ConfigError(f"max_length must be >= 1, got {max_length}")
        self.__dict__.update(_charset_fields())
        self.max_length = int(max_length)
        if seed is not None:
            self.seed(seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"TextSpace(max_length={self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, TextSpace) and other.max_length == self.max_length


@functools.cache
def _charset_fields() -> dict[str, Any]:
    """The attributes ``gymnasium.spaces.Text.__init__`` sets for :data:`SAMPLE_CHARSET` and ``min_length`` 0,
    without the length bound and a generator (whatever gymnasium's version keeps there)."""
    template = spaces.Text(max_length=1, min_length=0, charset=SAMPLE_CHARSET)
    fields = dict(vars(template))
    del fields["max_length"]
    fields["_np_random"] = None
    return fields


def prompt_space(max_length: int) -> spaces.Dict:
    """The observation space of every protocol agent: ``{"prompt": TextSpace}``.

    A ``Dict`` (with no ``"observation"`` key) because PettingZoo's ``api_test`` cannot handle a bare
    ``Text`` observation.
    """
    return spaces.Dict({"prompt": TextSpace(max_length)})
