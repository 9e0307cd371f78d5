"""Limits, then the audit hook (PEP 578), for both sandboxed processes; and small fd helpers.

The hook is defence in depth (the boundary is bwrap): it refuses sockets, process spawning, ``ctypes``,
writes and directory opens outside the working directory, ``/proc``, and frame/``gc`` introspection.
Once installed it cannot be removed, so only the sandbox's own entry points call :func:`limits_and_guard`.
"""

import os
import resource
import sys
import traceback

REFUSED = frozenset({
    "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "os.system", "os.exec",
    "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "subprocess.Popen", "pty.spawn",
    "os.setuid", "os.setgid", "os.chroot", "gc.get_objects", "gc.get_referrers",
    "gc.get_referents", "sys._current_frames", "sys.addaudithook",
    "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.call_function", "ctypes.cdata",
    "ctypes.cdata/buffer", "ctypes.string_at", "ctypes.wstring_at", "ctypes.PyObj_FromPtr",
    "ctypes.set_errno",
})
# event -> the positions of its path arguments
PATH_EVENTS = {"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1),
               "os.symlink": (1,), "os.link": (1,), "os.truncate": (0,), "os.chmod": (0,),
               "os.chown": (0,), "os.utime": (0,), "shutil.rmtree": (0,), "os.chflags": (0,)}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
MAX_OPEN_FILES = 256  # bounds the pipe buffers one process can hold (kernel memory no other limit counts)


def make_hook(root):
    """The audit hook for a process whose only writable directory is ``root``."""
    realpath, fsdecode, sep, isdir, getpid = os.path.realpath, os.fsdecode, os.sep, os.path.isdir, os.getpid
    root = realpath(root)

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
            writing = (isinstance(flags, int) and flags & WRITE_FLAGS) or (mode and any(c in mode for c in "wax+"))
            if not isinstance(path, int) and not inside(path) and (writing or isdir(path)
                                                                    or fsdecode(path).startswith("/proc")):
                raise PermissionError(f"sandbox: {path} refused")
        elif event in REFUSED:
            raise PermissionError(f"sandbox: {event} refused")
        elif event in ("os.kill", "os.killpg") and args[0] not in (0, getpid()):
            raise PermissionError("sandbox: signals to other processes refused")
        elif event in PATH_EVENTS:
            for i in PATH_EVENTS[event]:
                if not inside(args[i]):
                    raise PermissionError(f"sandbox: {event} outside the working directory refused")

    return hook


def _at_most(limit, value):
    hard = resource.getrlimit(limit)[1]
    return value if hard == resource.RLIM_INFINITY else min(value, hard)


def limits_and_guard(memory, cpu, fsize, nproc, root):
    """Set the rlimits (bytes, seconds, bytes, processes; open files, no core), close stdin, install the hook for ``root``."""
    for limit, value in ((resource.RLIMIT_AS, memory), (resource.RLIMIT_CPU, cpu),
                         (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_NPROC, nproc),
                         (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NOFILE, _at_most(resource.RLIMIT_NOFILE,
                                                                                     MAX_OPEN_FILES))):
        resource.setrlimit(limit, (value, value + 1 if limit == resource.RLIMIT_CPU else value))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.addaudithook(make_hook(root))


def limits_from_argv(argv):
    """``argv[1:6]``: memory bytes, cpu seconds, file-size bytes, max processes, writable root."""
    return (*(int(a) for a in argv[1:5]), argv[5])


def read_source(fd):
    """The UTF-8 text in ``fd`` (a memfd, read from its start); closes it."""
    os.lseek(fd, 0, 0)
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode("utf-8")


def flush():
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except Exception:
            pass


def fail():
    """Print the exception being handled (its traceback is the run's tail) and exit with status 1 at once."""
    flush()
    traceback.print_exc()
    flush()
    os._exit(1)
