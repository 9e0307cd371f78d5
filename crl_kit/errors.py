"""The library's error types: what a user can fix from the message alone.

Every error the library raises for a user's mistake or for a failure it has surfaced (a model that
failed for good, a missing optional dependency, no sandbox on this machine) is a :class:`CrlEnvsError`.
Each type also subclasses the built-in exception it replaces, so ``except ValueError``,
``except TypeError``, ``except RuntimeError`` and ``except ImportError`` keep working. The
``crl-envs`` command prints a :class:`CrlEnvsError` as one line (exit status 2) and lets any other
exception, a bug, show its traceback.

This module imports nothing of the project, so every layer (``agents`` included) may import it.
"""

from __future__ import annotations


class CrlEnvsError(Exception):
    """Base of the library's errors: a message that names the problem and the fix."""


class ConfigError(CrlEnvsError, ValueError):
    """A bad value: an unknown name (pool, task, protocol, option), a malformed spec, an out-of-range
    setting. A ``ValueError``."""


class ConfigTypeError(ConfigError, TypeError):
    """A value of the wrong type (``"5"`` where an int belongs). Both a ``TypeError`` and, as a
    :class:`ConfigError`, a ``ValueError``."""


class MissingDependencyError(CrlEnvsError, ImportError):
    """An optional package a feature needs is not installed; the message names what to install."""


class RunError(CrlEnvsError, RuntimeError):
    """A run cannot go on for a reason the user can fix (a missing checkpoint, no room on a cluster)."""


class ModelError(RunError):
    """A model failed for good (retries spent, out of memory on one request, a refused request): surfaced,
    never turned into a score."""


__all__ = ["CrlEnvsError", "ConfigError", "ConfigTypeError", "MissingDependencyError", "RunError", "ModelError"]
