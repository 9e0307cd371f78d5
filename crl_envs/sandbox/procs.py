"""What of a sandbox still runs, and reaping what of it was handed to this process.

| function | what |
|---|---|
| :func:`namespace_processes` | live processes of a PID namespace |
| :func:`session_processes` | live processes of a session |
| :func:`is_zombie` | exited and not reaped (or gone) |
| :func:`reap_orphans` | waits on the zombies a sandbox left with this process (a subreaper, or PID 1) |
"""

from __future__ import annotations

import os
import time


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


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` after ``pid (comm)``: state, ppid, pgrp, session, ... (None: no such process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()


def is_zombie(pid: int) -> bool:
    """Has ``pid`` exited but not been reaped (or is it gone)?"""
    fields = _stat_fields(pid)
    return fields is None or fields[:1] == ["Z"]


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
        fields = _stat_fields(int(entry))
        if fields and len(fields) > 3 and fields[3] == str(session_id) and fields[0] != "Z":
            found.append(int(entry))
    return found


def reap_orphans(pids: set[int], session: int, settle: float) -> None:
    """Reap what of a sandbox was handed to this process as its orphans' reaper (a subreaper, or PID 1):
    the PID namespace's init (``pids``) and anything of the launcher's session. Waits only on zombies
    that are this process's children, so no other child's exit status is taken."""
    me = os.getpid()
    deadline = time.monotonic() + settle
    pending = set(pids)
    while True:
        for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
            if entry.isdigit() and int(entry) not in pending:
                fields = _stat_fields(int(entry))
                if fields and len(fields) > 3 and fields[0] == "Z" and fields[1] == str(me) and fields[3] == str(session):
                    pending.add(int(entry))
        for pid in sorted(pending):
            fields = _stat_fields(pid)
            if fields is None or len(fields) < 2 or fields[1] != str(me):
                pending.discard(pid)  # gone, or someone else's child (reaped by the host's init)
            elif fields[0] == "Z":
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
                pending.discard(pid)
        if not pending or time.monotonic() >= deadline:
            return
        time.sleep(0.002)
