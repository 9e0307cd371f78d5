"""Shared by both sides: length-prefixed JSON frames and the tagged encoding of values.

Encoding (:func:`enc`) turns plain values into tagged JSON lists (ints as hex, floats as ``float.hex``);
any other object becomes ``ref(x)`` (a handle). Decoding (:func:`dec`) is strict: it builds exact
builtin types only and never calls anything the other side defined.
"""

import json
import os

MAX_FRAME = 1 << 25


def read_exact(fd, n):
    parts = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("the program ended before answering")
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def recv(fd):
    n = int.from_bytes(read_exact(fd, 4), "big")
    if n > MAX_FRAME:
        raise ValueError(f"an answer of {n} bytes is over the limit")
    return json.loads(read_exact(fd, n).decode("utf-8"))


def send(fd, obj):
    data = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[os.write(fd, data):]


SEQ = {list: "l", tuple: "t", set: "S", frozenset: "Z"}
BASES = (bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset)
TAGS = {"l": list, "t": tuple, "S": set, "Z": frozenset}


def enc(x, ref):
    t = type(x)
    if x is None:
        return ["n"]
    if t is bool:
        return ["b", x]
    if t is int:
        return ["i", format(x, "x")]
    if t is float:
        return ["f", x.hex()]
    if t is complex:
        return ["c", x.real.hex(), x.imag.hex()]
    if t is str:
        return ["s", x]
    if t is bytes:
        return ["y", x.hex()]
    if t in SEQ:
        return [SEQ[t], [enc(v, ref) for v in x]]
    if t is dict:
        return ["d", [[enc(k, ref), enc(v, ref)] for k, v in x.items()]]
    for base in BASES:  # a subclass (Counter, namedtuple, IntEnum, ...): its plain value, by the base's methods
        if isinstance(x, base):
            plain = dict(dict.items(x)) if base is dict else base(base.__iter__(x)) if base in SEQ else base(x)
            if type(plain) is base:
                return enc(plain, ref)
    return ref(x)


def dec(x, handle):
    """The plain value ``x`` stands for; ``handle`` turns an object reference into something usable."""
    if type(x) is not list or not x or type(x[0]) is not str:
        raise ValueError("malformed value from the other side")
    tag, n = x[0], len(x)
    if tag == "n" and n == 1:
        return None
    if tag == "b" and n == 2 and type(x[1]) is bool:
        return x[1]
    if tag == "i" and n == 2 and type(x[1]) is str:
        return int(x[1], 16)
    if tag == "f" and n == 2 and type(x[1]) is str:
        return float.fromhex(x[1])
    if tag == "c" and n == 3 and type(x[1]) is str and type(x[2]) is str:
        return complex(float.fromhex(x[1]), float.fromhex(x[2]))
    if tag == "s" and n == 2 and type(x[1]) is str:
        return x[1]
    if tag == "y" and n == 2 and type(x[1]) is str:
        return bytes.fromhex(x[1])
    if tag in TAGS and n == 2 and type(x[1]) is list:
        return TAGS[tag](dec(v, handle) for v in x[1])
    if tag == "d" and n == 2 and type(x[1]) is list:
        out = {}
        for pair in x[1]:
            if type(pair) is not list or len(pair) != 2:
                raise ValueError("malformed dict from the other side")
            out[dec(pair[0], handle)] = dec(pair[1], handle)
        return out
    if tag in ("r", "g", "R") and n == 2:
        return handle(x)
    raise ValueError("malformed value from the other side")
