"""The protocol roster (``crl_envs.roster.VERSIONS``): every list of protocols is derived from it, and a
version bump deprecates the old name as PettingZoo does."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pettingzoo.utils.deprecated_module import DeprecatedEnv

import crl_envs
from crl_envs import protocols, roster


def test_every_roster_is_the_table():
    assert list(protocols.PROTOCOLS) == list(roster.VERSIONS)
    assert list(crl_envs.PROTOCOL_MODULES) == list(roster.VERSIONS)
    exported = [n for n in crl_envs.__all__ if roster.parse(n)]
    assert exported == [f"{name}_v{v}" for name, v in roster.VERSIONS.items()]
    for name, factory in protocols.PROTOCOLS.items():
        env_class = protocols.env_class(factory)
        assert env_class.metadata["name"] == roster.versioned(name) == f"{name}_v0"
        assert protocols.get(roster.versioned(name)) is factory is protocols.get(name)


def test_the_roster_is_known_without_importing_a_protocol():
    code = ("import sys, crl_envs; print(len(crl_envs.PROTOCOL_MODULES), "
            "sorted(m for m in sys.modules if m.startswith(('crl_envs.protocols', 'torch'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(len(roster.VERSIONS)), "[]"], out.stdout + out.stderr


def test_a_newer_version_deprecates_the_old_name(monkeypatch):
    """A fake ``debate_v1``: the old name warns, and calling it raises PettingZoo's ``DeprecatedEnv``."""
    monkeypatch.setitem(roster.VERSIONS, "debate", 1)
    assert roster.versioned("debate") == "debate_v1"
    assert crl_envs.debate_v1 is protocols.PROTOCOLS["debate"]
    with pytest.warns(DeprecationWarning, match="debate_v0 is now deprecated, use debate_v1 instead"):
        old = crl_envs.debate_v0
    with pytest.raises(DeprecatedEnv, match="debate_v0 is now deprecated, use debate_v1 instead"):
        old(None, "arith")
    with pytest.raises(DeprecatedEnv, match="use debate_v1 instead"), pytest.warns(DeprecationWarning):
        protocols.get("debate_v0")
    assert protocols.get("debate_v1") is protocols.PROTOCOLS["debate"]
    with pytest.raises(AttributeError, match="has no attribute 'debate_v2'"):
        crl_envs.debate_v2  # noqa: B018
    with pytest.raises(ValueError, match="unknown protocol 'debate_v2'"):
        protocols.get("debate_v2")
    assert not hasattr(crl_envs, "vote_v1")  # only the bumped protocol moved
