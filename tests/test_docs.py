"""Every ```python block of README.md and of the documentation site's pages (docs/*.md) runs as
written, each in a fresh interpreter, offline; and the site builds with warnings as errors.

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

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: README and every page of the documentation site (mkdocs.yml's docs_dir).
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
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

    page: str = "README.md"  # the file, relative to the repository root

    @property
    def id(self) -> str:
        return f"{self.page}:line{self.line}"


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


def _page_blocks(path: Path) -> list[Block]:
    page = str(path.relative_to(ROOT))
    blocks = python_blocks(path.read_text(encoding="utf-8"))
    for b in blocks:
        b.page = page
    return blocks


BLOCKS = [b for path in PAGES for b in _page_blocks(path)]


def _params():
    for b in BLOCKS:
        marks = []
        if b.marker == "not-run":
            marks.append(pytest.mark.skip(reason=f"{b.page} marks it not-run: {b.reason}"))
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
        pytest.fail(f"{block.page} block at line {block.line} ran past {limit} s; make it faster or mark it "
                    "<!-- slow: reason -->")
    assert done.returncode == 0, (f"{block.page} block at line {block.line} failed:\n{block.code}\n"
                                  f"--- stderr ---\n{done.stderr[-4000:]}")


def test_opt_outs_are_few_and_explained():
    assert BLOCKS, "README.md and docs/ have no python blocks"
    not_run = [b for b in BLOCKS if b.marker == "not-run"]
    assert len(not_run) <= MAX_NOT_RUN, f"{len(not_run)} doc blocks are not run: {[b.id for b in not_run]}"
    for b in BLOCKS:
        if b.marker is not None:
            assert b.reason and len(b.reason.split()) >= 3, (
                f"{b.page} line {b.line}: <!-- {b.marker}: ... --> needs a reason (what it needs, or how long it takes)")


def test_markers_are_parsed():
    text = "x\n<!-- not-run: needs a GPU here -->\n```python\nprint(1)\n```\n\n```python\nprint(2)\n```\n" \
           "<!-- slow -->\n\n```python\npass\n```\n"
    a, b, c = python_blocks(text)
    assert (a.line, a.marker, a.reason, a.code) == (3, "not-run", "needs a GPU here", "print(1)\n")
    assert (b.marker, b.code) == (None, "print(2)\n")
    assert (c.marker, c.reason) == ("slow", None)
    with pytest.raises(ValueError, match="unclosed"):
        python_blocks("```python\nprint(1)\n")


#: README is the entry point a newcomer reads in five minutes; the rest lives in docs/.
README_MAX_LINES = 250
_BENCH = re.compile(r"(?P<figure>[-+]?\d[\d.,]*\s*(?:x|s|ms|min|minutes|%|tok/s)?)\**\s*<!--\s*bench:\s*(?P<name>[\w-]+)\s*-->")


def test_readme_is_an_entry_point():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines (at most {README_MAX_LINES}): move sections to docs/"
    text = README.read_text(encoding="utf-8")
    assert "<!-- test-command -->" in text and "<!-- main-command -->" in text, ".ci/run reads these markers"


def bench_figures(text: str) -> list[tuple[int, str, str, str]]:
    """``(line, figure, benchmark name, the whole line)`` for every ``<!-- bench: NAME -->`` marker."""
    out = []
    for k, line in enumerate(text.splitlines(), 1):
        found = list(_BENCH.finditer(line))
        markers = re.sub(r"`[^`]*`", "", line).count("<!-- bench:")  # not those quoted as code
        if len(found) != markers:  # a marker with no figure before it on its line checks nothing
            raise AssertionError(f"line {k}: a <!-- bench: --> marker without a figure right before it: {line.strip()!r}")
        for m in found:
            out.append((k, m.group("figure").strip(), m.group("name"), line))
    return out


def test_bench_marker_parsing():
    line = "HFAgent took **31 s**<!-- bench: cpu_backends --> and vLLM 1.85x <!-- bench: cpu_backends -->."
    assert [(f, n) for _, f, n, _ in bench_figures(line)] == [("31 s", "cpu_backends"), ("1.85x", "cpu_backends")]
    with pytest.raises(AssertionError, match="without a figure"):
        bench_figures("a figure on the line before\n<!-- bench: cpu_backends --> checks nothing")


def test_quoted_figures_match_the_recorded_benchmarks():
    """A figure marked ``<!-- bench: NAME -->`` appears in NAME's recorded output (``python -m
    benchmarks.all``), and a figure from a loaded run says so on its line."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.all import BENCHMARKS, figure_problem, read_results

    results = read_results()
    known = {b.name for b in BENCHMARKS}
    problems = []
    for path in PAGES:
        for line, figure, name, text in bench_figures(path.read_text(encoding="utf-8")):
            where = f"{path.relative_to(ROOT)}:{line}"
            if name not in known:
                problems.append(f"{where}: no benchmark named {name!r} in benchmarks/all.py")
            elif name not in results:
                problems.append(f"{where}: {name} has no recorded run: python -m benchmarks.all --only {name}")
            else:
                entry = results[name]
                problem = figure_problem(name, figure, entry)
                if problem:
                    problems.append(f"{where}: {problem}")
                elif entry["loaded"] and "loaded" not in text.lower():
                    problems.append(f"{where}: {name} ran on a loaded machine (load {entry['load_before']}); say so")
    assert not problems, "\n".join(problems)


def test_docs_site_builds_strictly(tmp_path):
    """``mkdocs build --strict``: broken links, missing pages and docstring warnings fail the suite."""
    pytest.importorskip("mkdocs", reason="the docs extra (in dev) installs mkdocs")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "index.html").exists() and (tmp_path / "site" / "api" / "index.html").exists()
