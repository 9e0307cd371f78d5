"""Direct unit tests of the in-sandbox modules (``crl_envs/sandbox/inside``): the codec, the program's
server and the checker, run here in-process over real pipes (no sandbox, no audit hook installed)."""

from __future__ import annotations

import ast
import collections
import enum
import math
import os
import sys
import threading
from importlib import resources

import pytest

from crl_envs.sandbox.inside import MODULES, checker, codec, program
from crl_envs.sandbox.launch import bootstrap


def _opaque(x):
    return ["r", id(x)]


@pytest.mark.parametrize("value", [None, True, False, 0, -1, 2**200, -(3**90), 0.1, -0.0, math.inf, 1e-310,
                                   complex(1.5, -2), "", "héllo\n\x00", "\ud800", b"\x00\xff", [1, [2, [3]]],
                                   (1, "a"), {1, 2}, frozenset({"x"}), {"k": [1, (2, 3)], 4: None}, ((),)])
def test_plain_values_round_trip_exactly_through_a_pipe(value):
    r, w = os.pipe()
    try:
        codec.send(w, codec.enc(value, _opaque))
        back = codec.dec(codec.recv(r), lambda x: pytest.fail("no handles expected"))
    finally:
        os.close(r)
        os.close(w)
    assert back == value and type(back) is type(value)
    if isinstance(value, float):
        assert math.copysign(1, back) == math.copysign(1, value)  # -0.0 stays -0.0 (float.hex)


def test_builtin_subclasses_arrive_as_their_plain_value_and_other_objects_as_handles():
    Point = collections.namedtuple("Point", "x y")

    class Color(enum.IntEnum):
        RED = 3

    class Liar(int):
        def __eq__(self, other):
            return True

    for value, plain in ((collections.Counter("aab"), {"a": 2, "b": 1}), (Point(1, 2), (1, 2)), (Color.RED, 3),
                         (Liar(5), 5), (collections.OrderedDict(a=1), {"a": 1})):
        back = codec.dec(codec.enc(value, _opaque), None)
        assert back == plain and type(back) is type(plain)
        assert not (back == 6)  # the subclass's __eq__ did not come along
    seen = []
    assert codec.enc(object, lambda x: seen.append(x) or ["r", 0]) == ["r", 0] and seen == [object]


@pytest.mark.parametrize("malformed", [[], "s", ["i", 5], ["b", 1], ["s", 1], ["f", 1.0], ["l", "ab"], ["d", [[1]]],
                                       ["x", 1], ["n", 1], [3], ["c", "0x1p0"]])
def test_decoding_is_strict(malformed):
    with pytest.raises(ValueError, match="malformed"):
        codec.dec(malformed, lambda x: x)


def test_frames_over_the_limit_and_early_ends_are_refused():
    r, w = os.pipe()
    try:
        os.write(w, (codec.MAX_FRAME + 1).to_bytes(4, "big"))
        with pytest.raises(ValueError, match="over the limit"):
            codec.recv(r)
        os.write(w, (10).to_bytes(4, "big") + b"[1")
        os.close(w)
        w = None
        with pytest.raises(EOFError):
            codec.recv(r)
    finally:
        os.close(r)
        if w is not None:
            os.close(w)


class _Pair:
    def __init__(self, a, b):
        self.a, self.b = a, b


def _run_checker(program_source: str, tests: str, names, imports=()):
    """The checker's :func:`check` against :class:`program.Server` on a thread, over real pipes."""
    namespace = {"__name__": "__main__"}
    exec(program_source, namespace)
    req_r, req_w = os.pipe()
    ans_r, ans_w = os.pipe()
    server = threading.Thread(target=program.Server(namespace).serve, args=(req_r, ans_w), daemon=True)
    server.start()
    try:
        conn = checker.Connection(req_w, ans_r)
        checker.check(compile(tests, "tests.py", "exec"), conn, list(names), list(imports))
        return conn.calls
    finally:
        os.close(req_w)
        server.join(5)
        for fd in (req_r, ans_r, ans_w):
            os.close(fd)


def test_checker_passes_right_answers_and_fails_wrong_ones():
    source = "def f(x):\n    return 2 * x\ndef g(xs):\n    xs.append(len(xs))\n"
    assert _run_checker(source, "assert f(3) == 6\nys = [7]\ng(ys)\nassert ys == [7, 1]", ["f", "g"]) == 2
    with pytest.raises(AssertionError):
        _run_checker(source, "assert f(3) == 7", ["f"])
    with pytest.raises(AssertionError, match="never called"):
        _run_checker(source, "assert 1 == 1", ["f"])
    with pytest.raises(KeyError, match="raised by the program"):  # the same builtin class, not the program's
        _run_checker("def f(x):\n    raise KeyError(x)", "f(1)", ["f"])
    with pytest.raises(NameError, match="not defined by the program"):
        _run_checker(source, "h(1)", ["h"])


def test_program_objects_are_handles_that_refuse_comparison():
    source = "class Yes:\n    __eq__ = lambda s, o: True\n    __bool__ = lambda s: True\ndef f():\n    return Yes()\n" \
             "class P:\n    def __init__(s, a):\n        s.a = a\ndef total(ps):\n    return sum(p.a for p in ps)\n"
    assert _run_checker(source, "assert total([P(1), P(2)]) == 3\nassert P(5).a == 5", ["P", "total"]) == 5
    for tests in ("assert f() == 1", "assert f()", "hash(f())", "f() + 1", "assert 1 in [f()]"):
        with pytest.raises(TypeError, match="object of the program"):
            _run_checker(source, tests, ["f"])


def test_only_the_names_given_come_from_the_program():
    forged = "class math:\n    isclose = staticmethod(lambda *a, **k: True)\ndef volume_sphere(r):\n    return 0\n"
    right = "import math\ndef volume_sphere(r):\n    return 4 / 3 * math.pi * r ** 3\n"
    tests = "assert math.isclose(volume_sphere(10), 4188.790204786391, rel_tol=0.001)"
    assert _run_checker(forged, tests, ["math", "volume_sphere"]) == 3  # the program's math: a forged pass
    with pytest.raises(AssertionError):
        _run_checker(forged, tests, ["volume_sphere"], ["math"])  # the standard library's math
    assert _run_checker(right, tests, ["volume_sphere"], ["math"]) == 1


def test_inside_modules_import_only_the_standard_library_and_each_other():
    folder = resources.files("crl_envs.sandbox.inside")
    for name in MODULES:
        tree = ast.parse(folder.joinpath(f"{name}.py").read_text("utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.module is None and {a.name for a in node.names} <= set(MODULES), (name, ast.dump(node))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                top = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                assert all(m.split(".")[0] in sys.stdlib_module_names for m in top), (name, top)


def test_bootstrap_carries_the_modules_as_text_and_loads_them_as_their_own_package():
    text = bootstrap("checker")
    assert "crl_envs" not in text
    compile(text, "<bootstrap>", "exec")
    with pytest.raises(ValueError, match="'program' or 'checker'"):
        bootstrap("guard")
