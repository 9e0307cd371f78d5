"""Every ```python block of README.md runs as written, each in a fresh interpreter, offline.

A block that cannot run here says so on the line before it, with the reason:

    <!-- not-run: needs a GPU and the Hugging Face hub -->

and a block that runs but takes minutes is marked ``<!-- slow: reason -->`` (it then runs with the
slow tests). Opting out is visible in the README itself, and kept rare: see
:func:`test_opt_outs_are_few_and_explained`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
#: Wall-clock limits (seconds) per block. Plain blocks are written to run in under a minute on 2 idle cores;
#: the limit doubles that, so a busy machine does not fail them.
LIMIT, SLOW_LIMIT = 120, 900
#: At most this many python blocks may be left unrun.
MAX_NOT_RUN = 2
_MARKER = re.compile(r"^<!--\s*(not-run|slow)\s*(?::\s*(.*?))?\s*-->$")


@dataclass
class Block:
    line: int  # 1-based line of the opening fence
    code: str
    marker: str | None  # "not-run", "slow" or None
    reason: str | None

    @property
    def id(self) -> str:
        return f"line{self.line}"


def python_blocks(text: str) -> list[Block]:
    """The ```python blocks of ``text``, each with the marker comment on the line before it (if any)."""
    lines = text.splitlines()
    blocks, k = [], 0
    while k < len(lines):
        if lines[k].strip() == "```python":
            start = k
            k += 1
            body = []
            while k < len(lines) and lines[k].strip() != "```":
                body.append(lines[k])
                k += 1
            if k == len(lines):
                raise ValueError(f"README.md line {start + 1}: unclosed ```python block")
            before = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
            found = _MARKER.match(before)
            blocks.append(Block(start + 1, "\n".join(body) + "\n", found and found.group(1),
                                found and (found.group(2) or None)))
        k += 1
    return blocks


BLOCKS = python_blocks(README.read_text(encoding="utf-8"))


def _params():
    for b in BLOCKS:
        marks = []
        if b.marker == "not-run":
            marks.append(pytest.mark.skip(reason=f"README marks it not-run: {b.reason}"))
        elif b.marker == "slow":
            marks.append(pytest.mark.slow)
        yield pytest.param(b, id=b.id, marks=marks)


@pytest.mark.parametrize("block", list(_params()))
def test_readme_block_runs(block: Block, tmp_path):
    """Run the block in a fresh ``python`` in an empty directory, with its own valuation cache."""
    env = {**os.environ, "CRL_ENVS_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    limit = SLOW_LIMIT if block.marker == "slow" else LIMIT
    try:
        done = subprocess.run([sys.executable, "-c", block.code], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        pytest.fail(f"README.md block at line {block.line} ran past {limit} s; make it faster or mark it "
                    "<!-- slow: reason -->")
    assert done.returncode == 0, (f"README.md block at line {block.line} failed:\n{block.code}\n"
                                  f"--- stderr ---\n{done.stderr[-4000:]}")


def test_opt_outs_are_few_and_explained():
    assert BLOCKS, "README.md has no python blocks"
    not_run = [b for b in BLOCKS if b.marker == "not-run"]
    assert len(not_run) <= MAX_NOT_RUN, f"{len(not_run)} README blocks are not run: {[b.line for b in not_run]}"
    for b in BLOCKS:
        if b.marker is not None:
            assert b.reason and len(b.reason.split()) >= 3, (
                f"README.md line {b.line}: <!-- {b.marker}: ... --> needs a reason (what it needs, or how long it takes)")


def test_markers_are_parsed():
    text = "x\n<!-- not-run: needs a GPU here -->\n```python\nprint(1)\n```\n\n```python\nprint(2)\n```\n" \
           "<!-- slow -->\n\n```python\npass\n```\n"
    a, b, c = python_blocks(text)
    assert (a.line, a.marker, a.reason, a.code) == (3, "not-run", "needs a GPU here", "print(1)\n")
    assert (b.marker, b.code) == (None, "print(2)\n")
    assert (c.marker, c.reason) == ("slow", None)
    with pytest.raises(ValueError, match="unclosed"):
        python_blocks("```python\nprint(1)\n")
