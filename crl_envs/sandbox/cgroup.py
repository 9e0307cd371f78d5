"""One cgroup per sandbox: its memory (all processes, memfd and tmpfs pages included), its process
count and its CPU bandwidth, capped as a whole. cgroup v2 (``memory.max``) or v1
(``memory.limit_in_bytes``), whichever holds the memory controller here; none where neither is
writable (then only the per-process rlimits cap memory: :func:`cgroup_support` says why).

| file (v2 / v1) | set to |
|---|---|
| ``memory.max`` + ``memory.swap.max`` / ``memory.limit_in_bytes`` + ``memory.memsw.limit_in_bytes`` | the sandbox's memory, no swap |
| ``pids.max`` / ``pids.max`` | the process limit (threads count) |
| ``cpu.max`` / ``cpu.cfs_quota_us`` | one CPU's bandwidth for all its processes together |
"""

from __future__ import annotations

import functools
import itertools
import os
import time
from dataclasses import dataclass

CPU_PERIOD_US = 100_000
PREFIX = "crl-sandbox-"
_names = itertools.count()


@dataclass(frozen=True)
class CgroupSupport:
    """Where sandbox groups are made: ``version`` ("v1"/"v2") and a parent directory per controller."""

    version: str
    parents: dict[str, str]  # controller ("memory", "pids", "cpu") -> directory the groups are made in

    def describe(self) -> str:
        return f"cgroup {self.version}: " + ", ".join(c for c in ("memory", "pids", "cpu") if c in self.parents)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount root, mount point, fstype, super options) of each cgroup mount, from /proc/self/mountinfo."""
    found = []
    for line in _read("/proc/self/mountinfo").splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            found.append((fields[3], fields[4], tail[0], set(tail[2].split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """This process's cgroup per v1 controller, and ``""`` -> its v2 cgroup, from /proc/self/cgroup."""
    paths = {}
    for line in _read("/proc/self/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _under(mount_root: str, mount_point: str, path: str) -> str | None:
    if mount_root != "/" and path != mount_root and not path.startswith(mount_root + "/"):
        return None
    rel = path[len(mount_root):] if mount_root != "/" else path
    return os.path.join(mount_point, rel.lstrip("/"))


def _try_group(parent: str, files: list[str]) -> bool:
    """Can a group be made in ``parent`` with ``files`` writable? (made and removed again)"""
    probe = os.path.join(parent, f"{PREFIX}{os.getpid()}-probe")
    try:
        os.mkdir(probe)
    except FileExistsError:
        pass
    except OSError:
        return False
    try:
        return all(os.access(os.path.join(probe, f), os.W_OK) for f in files)
    finally:
        _rmdir(probe, wait=0.5)


def _v1() -> CgroupSupport | None:
    own, parents = _own_paths(), {}
    for mount_root, point, fstype, options in _mounts():
        for controller, limit_file in (("memory", "memory.limit_in_bytes"), ("pids", "pids.max"),
                                       ("cpu", "cpu.cfs_quota_us")):
            if fstype == "cgroup" and controller in options and controller in own and controller not in parents:
                parent = _under(mount_root, point, own[controller])
                if parent and os.path.isdir(parent) and _try_group(parent, ["cgroup.procs", limit_file]):
                    parents[controller] = parent
    return CgroupSupport("v1", parents) if "memory" in parents else None


def _v2() -> CgroupSupport | None:
    own = _own_paths().get("")
    for mount_root, point, fstype, _ in _mounts():
        if fstype != "cgroup2" or own is None:
            continue
        mine = _under(mount_root, point, own)
        if not mine:
            continue
        for parent in (mine, os.path.dirname(mine.rstrip("/"))):  # a delegated subtree, else beside ours
            control = os.path.join(parent, "cgroup.subtree_control")
            try:
                enabled = set(_read(control).split())
                for controller in ("memory", "pids", "cpu"):
                    if controller not in enabled:
                        try:
                            _write(control, f"+{controller}")
                        except OSError:
                            pass  # EBUSY: processes live in it (only the real root is exempt); EINVAL: not here
                enabled = set(_read(control).split())
            except OSError:
                continue
            if "memory" in enabled and _try_group(parent, ["cgroup.procs", "memory.max"]):
                return CgroupSupport("v2", {c: parent for c in ("memory", "pids", "cpu") if c in enabled})
    return None


@functools.lru_cache(maxsize=1)
def cgroup_support() -> CgroupSupport | None:
    """The cgroup set-up that caps a sandbox as a whole here, or ``None`` (not Linux, no writable
    memory controller: e.g. not root and no delegated subtree). Leftover groups of dead processes are
    removed on the way."""
    if not os.path.exists("/proc/self/cgroup"):
        return None
    try:
        support = _v2() if any(t == "cgroup2" and "memory" in _v2_controllers(p) for _, p, t, _ in _mounts()) else None
        support = support or _v1()
    except OSError:
        return None
    if support is not None:
        for parent in set(support.parents.values()):
            _remove_stale(parent)
    return support


def _v2_controllers(mount_point: str) -> set[str]:
    try:
        return set(_read(os.path.join(mount_point, "cgroup.controllers")).split())
    except OSError:
        return set()


def _remove_stale(parent: str) -> None:
    try:
        entries = os.listdir(parent)
    except OSError:
        return
    for entry in entries:
        pid = entry[len(PREFIX):].split("-")[0] if entry.startswith(PREFIX) else ""
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            _rmdir(os.path.join(parent, entry), wait=0.0)


def _rmdir(path: str, wait: float) -> bool:
    deadline = time.monotonic() + wait
    while True:
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)


class Cgroup:
    """A fresh group (one per controller directory) with the sandbox's limits; :meth:`add` a process
    before it starts anything, :meth:`remove` once everything in it has died."""

    def __init__(self, support: CgroupSupport, *, memory_bytes: int, max_processes: int, cpus: float = 1.0):
        self.support = support
        name = f"{PREFIX}{os.getpid()}-{next(_names)}"
        self.dirs: dict[str, str] = {}
        try:
            for controller, parent in support.parents.items():
                path = os.path.join(parent, name)
                if path not in self.dirs.values():
                    os.mkdir(path)
                self.dirs[controller] = path
            v2 = support.version == "v2"
            memory = self.dirs["memory"]
            if v2:
                _write(os.path.join(memory, "memory.max"), str(memory_bytes))
                self._optional(os.path.join(memory, "memory.swap.max"), "0")
            else:
                _write(os.path.join(memory, "memory.limit_in_bytes"), str(memory_bytes))
                self._optional(os.path.join(memory, "memory.memsw.limit_in_bytes"), str(memory_bytes))
            if "pids" in self.dirs:
                _write(os.path.join(self.dirs["pids"], "pids.max"), str(max_processes))
            if "cpu" in self.dirs:
                quota = str(int(cpus * CPU_PERIOD_US))
                if v2:
                    _write(os.path.join(self.dirs["cpu"], "cpu.max"), f"{quota} {CPU_PERIOD_US}")
                else:
                    _write(os.path.join(self.dirs["cpu"], "cpu.cfs_period_us"), str(CPU_PERIOD_US))
                    _write(os.path.join(self.dirs["cpu"], "cpu.cfs_quota_us"), quota)
        except BaseException:
            self.remove(wait=0.0)
            raise

    @staticmethod
    def _optional(path: str, value: str) -> None:
        try:
            _write(path, value)
        except OSError:
            pass  # no swap accounting here: nothing to cap

    def add(self, pid: int) -> None:
        """Move process ``pid`` (not yet started anything) into the group, for every controller."""
        for path in dict.fromkeys(self.dirs.values()):
            _write(os.path.join(path, "cgroup.procs"), str(pid))

    def peak_bytes(self) -> int | None:
        """The most memory the group held (v1 ``memory.max_usage_in_bytes``, v2 ``memory.peak``)."""
        name = "memory.peak" if self.support.version == "v2" else "memory.max_usage_in_bytes"
        try:
            return int(_read(os.path.join(self.dirs["memory"], name)))
        except (OSError, ValueError, KeyError):
            return None

    def oom_kills(self) -> int:
        """How many processes the kernel killed for the memory limit (``oom_kill`` in memory.events /
        memory.oom_control)."""
        name = "memory.events" if self.support.version == "v2" else "memory.oom_control"
        try:
            for line in _read(os.path.join(self.dirs["memory"], name)).splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError, KeyError):
            pass
        return 0

    def processes(self) -> list[int]:
        found: set[int] = set()
        for path in self.dirs.values():
            try:
                found.update(int(p) for p in _read(os.path.join(path, "cgroup.procs")).split())
            except (OSError, ValueError):
                pass
        return sorted(found)

    def remove(self, wait: float = 2.0) -> bool:
        """Kill what is left in the group and remove it; False if it could not be removed in ``wait`` s."""
        if self.support.version == "v2" and "memory" in self.dirs:
            try:
                _write(os.path.join(self.dirs["memory"], "cgroup.kill"), "1")
            except OSError:
                pass
        for pid in self.processes():
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        removed = True
        for path in dict.fromkeys(self.dirs.values()):
            removed = _rmdir(path, wait) and removed
        return removed
