"""The program's process: run the candidate code, then (mode ``serve``) answer the checker's calls.

``argv[6:]``: the mode (``run`` or ``serve``), the source fd, then for ``run`` the fd to report
completion on, for ``serve`` the request fd and the answer fd.
"""

import builtins
import os
import sys

from . import codec, guard

MAX_ITEMS = 1000000


class Server:
    """Answers requests about the program's globals ``namespace``: a call, an attribute, items, ``len``,
    iteration. Objects that are not plain values stay here; the checker gets handles to them."""

    def __init__(self, namespace):
        self.namespace = namespace
        self.objects = []

    def ref(self, x):
        self.objects.append(x)
        return ["r", len(self.objects) - 1]

    def resolve(self, x):
        if x[0] == "R" and type(x[1]) is list and len(x[1]) == 2:
            return self.resolve(x[1])
        if x[0] == "g":
            if x[1] not in self.namespace:
                raise NameError(f"name {x[1]!r} is not defined by the program")
            return self.namespace[x[1]]
        return self.objects[x[1]]

    def answer(self, request):
        """The reply (``["ok", value, changed arguments]``) to one request; raises what the program raises."""
        op, target = request[0], self.resolve(request[1])
        enc, ref = codec.enc, self.ref
        if op == "call":
            args = [codec.dec(a, self.resolve) for a in request[2]]
            kwargs = {k: codec.dec(v, self.resolve) for k, v in request[3]}
            value = target(*args, **kwargs)
            changed = [[i, enc(a, ref)] for i, a in enumerate(args) if type(a) in (list, dict, set)]
            return ["ok", enc(value, ref), changed]
        if op == "getattr":
            return ["ok", enc(getattr(target, request[2]), ref), []]
        if op == "iter":
            values = []
            for v in target:
                values.append(v)
                if len(values) > MAX_ITEMS:
                    raise ValueError("more than 10**6 items")
            return ["ok", enc(values, ref), []]
        if op == "len":
            return ["ok", enc(len(target), ref), []]
        if op == "getitem":
            return ["ok", enc(target[codec.dec(request[2], self.resolve)], ref), []]
        raise ValueError("unknown request")

    def serve(self, requests, answers):
        """Answer requests from fd ``requests`` on fd ``answers`` until the checker closes its end."""
        while True:
            try:
                request = codec.recv(requests)
            except EOFError:
                return
            try:
                reply = self.answer(request)
            except BaseException as e:
                reply = ["err", type(e).__name__, str(e)[:2000]]
            guard.flush()
            try:
                codec.send(answers, reply)
            except RecursionError:
                codec.send(answers, ["err", "RecursionError", "value too deeply nested"])


def main(argv):
    mode, fds = argv[6], [int(a) for a in argv[7:]]
    code = compile(guard.read_source(fds[0]), "program.py", "exec")
    guard.limits_and_guard(*guard.limits_from_argv(argv))
    sys.argv = ["program.py"]
    namespace = {"__name__": "__main__", "__builtins__": builtins, "__file__": "program.py"}
    try:
        exec(code, namespace)
    except BaseException:
        guard.fail()
    guard.flush()
    if mode == "run":
        os.write(fds[1], b"done")
        os._exit(0)
    Server(namespace).serve(fds[1], fds[2])
    os._exit(0)
