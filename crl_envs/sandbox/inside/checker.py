"""The checker's process: run the tests, in which the program's names are proxies; write the verdict.

``argv[6:]``: source fd, request fd, answer fd, verdict fd, the program's names (JSON), the standard
library modules to import for names the tests use but never import (JSON).
"""

import builtins
import importlib
import json
import os

from . import codec, guard

ERRORS = {n: e for n, e in vars(builtins).items() if isinstance(e, type) and issubclass(e, Exception)}


def _refuse(self, *args):
    raise TypeError("an object of the program (not a plain int/str/list/... value) cannot be compared, "
                    "hashed, tested for truth or computed with")


class Connection:
    """The checker's end of the pipes to the program: one request, one strictly decoded reply."""

    def __init__(self, requests, answers):
        self.requests, self.answers, self.calls = requests, answers, 0

    def ask(self, request):
        """``(value, changed)``: the decoded answer and the in-place changes to list/dict/set arguments."""
        self.calls += 1
        codec.send(self.requests, request)
        reply = codec.recv(self.answers)
        if type(reply) is list and len(reply) == 3 and reply[0] == "err" and type(reply[1]) is str:
            error = ERRORS.get(reply[1], RuntimeError)
            if issubclass(error, (StopIteration, StopAsyncIteration)):
                # PEP 479's rule: a StopIteration must not end the checker's loop (``all(map(...))`` would
                # stop early and pass); it crosses from the program as a RuntimeError.
                raise RuntimeError(f"(raised by the program) {reply[1]}: {reply[2]}")
            raise error(f"(raised by the program) {reply[2]}")
        if type(reply) is not list or len(reply) != 3 or reply[0] != "ok" or type(reply[2]) is not list:
            raise ValueError("malformed answer from the program")
        changed = []
        for item in reply[2]:
            if type(item) is not list or len(item) != 2:
                raise ValueError("malformed answer from the program")
            changed.append((item[0], codec.dec(item[1], self.handle)))
        return codec.dec(reply[1], self.handle), changed

    def handle(self, x):
        if x[0] != "r" or type(x[1]) is not int:
            raise ValueError("malformed value from the program")
        return Remote(self, x)

    def remote(self, name):
        """The proxy for the program's global ``name``."""
        return Remote(self, ["g", name])


def _out(x):
    if type(x) is Remote:
        return ["R", object.__getattribute__(x, "_ref")]
    raise TypeError(f"cannot pass a {type(x).__name__} to the program (plain values only)")


class Remote:
    """An object of the program: it can be called, asked for attributes, items, ``len`` and iteration
    (answers come back as plain values), or passed back; never compared, hashed or tested for truth."""

    __slots__ = ("_conn", "_ref")

    def __init__(self, conn, ref):
        object.__setattr__(self, "_conn", conn)
        object.__setattr__(self, "_ref", ref)

    def __call__(self, *args, **kwargs):
        value, changed = self._conn.ask(["call", self._ref, [codec.enc(a, _out) for a in args],
                                         [[k, codec.enc(v, _out)] for k, v in kwargs.items()]])
        for i, new in changed:  # in-place changes to list/dict/set arguments
            if type(i) is int and 0 <= i < len(args) and type(args[i]) is type(new):
                if type(new) is list:
                    args[i][:] = new
                else:
                    args[i].clear()
                    args[i].update(new)
        return value

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._conn.ask(["getattr", self._ref, name])[0]

    def __iter__(self):
        return iter(self._conn.ask(["iter", self._ref])[0])

    def __len__(self):
        n = self._conn.ask(["len", self._ref])[0]
        if type(n) is not int:
            raise TypeError("len() of a program object is not an int")
        return n

    def __getitem__(self, key):
        return self._conn.ask(["getitem", self._ref, codec.enc(key, _out)])[0]

    def __repr__(self):
        return "<object of the program>"

    __hash__ = __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __contains__ = _refuse
    __index__ = __int__ = __float__ = __complex__ = __round__ = __abs__ = __neg__ = __pos__ = _refuse
    for _op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor", "lshift",
                "rshift", "matmul", "divmod"):
        locals()[f"__{_op}__"] = locals()[f"__r{_op}__"] = _refuse
    del _op


def check(code, conn, names, imports):
    """Run the compiled tests ``code``: each of ``names`` is the program's object of that name, each of
    ``imports`` the standard library module. Raises what the tests raise, or if they never called."""
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    namespace.update({name: importlib.import_module(name) for name in imports})
    namespace.update({name: conn.remote(name) for name in names})
    exec(code, namespace)
    if not conn.calls:
        raise AssertionError("the tests never called the program")


def main(argv):
    src_fd, requests, answers, verdict = (int(a) for a in argv[6:10])
    names, imports = json.loads(argv[10]), json.loads(argv[11])
    code = compile(guard.read_source(src_fd), "tests.py", "exec")
    guard.limits_and_guard(*guard.limits_from_argv(argv))
    try:
        check(code, Connection(requests, answers), names, imports)
    except BaseException:
        guard.fail()
    guard.flush()
    os.write(verdict, b"pass")
    os._exit(0)
