"""Reading and writing the files of on-disk caches and run directories safely: the one place for it.

A cache entry's path is derived from a public key, so anyone who can write the directory can put
something there. :func:`read_regular` reads only a regular file (a FIFO, a device or a socket at the
path is refused at once instead of hanging the reader; a symlink is refused, never followed);
:func:`atomic_write_json` writes so that a reader sees the old file or the whole new one.

Permissions (the same for the generation cache and the coalition cache): files are written
``0644 & ~umask``: readable by the others the user's umask lets read them (a shared cache stays
readable by the people it is shared with; mkstemp's 0600 would hide it), writable by the user only,
whatever the umask (a group-writable entry could be changed in place). What a reader trusts is
decided by :func:`trusted_directory` and ``read_regular(owner=...)`` (owned by the reader, not
writable by group or others), not by hiding the files.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["NotRegularFile", "atomic_write_json", "read_json", "read_regular", "trusted_directory", "open_append",
           "atomic_write_text"]


class NotRegularFile(OSError):
    """The path holds something other than a regular file (a FIFO, a device, a socket, a symlink)."""


def read_regular(path: str | os.PathLike, *, owner: int | None = None, max_bytes: int = 1 << 30) -> bytes:
    """The bytes of the regular file at ``path``, read without following a symlink and without
    blocking on a FIFO (``O_NONBLOCK | O_NOFOLLOW``, then ``fstat`` must say ``S_ISREG``).

    ``owner``: also require the file to belong to this uid and not be writable by group or others. Raises :class:`NotRegularFile` for
    anything else at the path, ``FileNotFoundError`` when nothing is there."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NotRegularFile(errno.ELOOP, "a symbolic link, not a regular file", str(path)) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", str(path))
        if owner is not None and info.st_uid != owner:
            raise NotRegularFile(errno.EPERM, f"owned by uid {info.st_uid}, not {owner}", str(path))
        if owner is not None and info.st_mode & 0o022:
            raise NotRegularFile(errno.EPERM, "writable by group or others", str(path))
        if info.st_size > max_bytes:
            raise NotRegularFile(errno.EFBIG, f"{info.st_size} bytes (more than {max_bytes})", str(path))
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_json(path: str | os.PathLike, *, owner: int | None = None) -> Any:
    """:func:`read_regular` then JSON (``UnicodeDecodeError``/``json.JSONDecodeError`` when damaged)."""
    return json.loads(read_regular(path, owner=owner).decode("utf-8"))


def trusted_directory(path: str | os.PathLike) -> str:
    """Why the directory ``path`` cannot be trusted with entries only its user may write ("" when it
    can): it must be a real directory (not a symlink), owned by this process's user, and not
    writable by group or others."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return ""
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory (or is a symbolic link)"
    if info.st_uid != os.getuid():
        return f"belongs to uid {info.st_uid}, not to you (uid {os.getuid()})"
    if info.st_mode & 0o022:
        return f"is writable by group or others (mode {stat.S_IMODE(info.st_mode):o}); chmod go-w it"
    return ""


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def atomic_write_json(path: Path, payload: Any, *, indent: int | None = None, sort_keys: bool = False) -> None:
    """Write ``payload`` to ``path`` so that readers see the old file or the whole new one: a unique
    temporary name in the same directory, fsync, rename, fsync of the directory. The file is
    ``0644 & ~umask`` (module docstring: readable where the umask allows, writable by its owner only)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.chmod(tmp, 0o644 & ~_umask())
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f, indent=indent, sort_keys=sort_keys)
            if indent is not None:
                f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    try:  # make the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def atomic_write_text(path: Path, text: str) -> None:
    """Replace the file at ``path`` with ``text`` atomically (a unique temporary name, then a rename:
    a link planted at ``path`` is replaced, never written through)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.chmod(tmp, 0o644 & ~_umask())
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def open_append(path: str | os.PathLike):
    """Open ``path`` for appending text without following a symlink planted there (``O_NOFOLLOW``);
    refuses anything but a regular file."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                 | getattr(os, "O_CLOEXEC", 0), 0o666)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegularFile(errno.EINVAL, "not a regular file", str(path))
    return os.fdopen(fd, "a")
