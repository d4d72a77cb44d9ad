"""Who may act on a run directory: the user who owns it, nobody else.

A run directory is a program to run (plan.json's argv, spec.toml), processes to signal
(state.json's pids), credentials (secrets.json) and a stop request (stop.json). Whoever can
write them decides what happens when another user's tunedeck adopts the run (starts a new
agent that runs the plan), stops it (signals the recorded pids) or dumps its stacks (a request
the recorded ranks answer). In a registry others can write into (a shared team TUNEDECK_HOME whose
runs/ is 1777), anyone can make a folder under runs/, so every path that adopts, signals,
executes or otherwise trusts a run directory first asks `problem`. A run directory is trusted
when

  - the run folder itself is a directory (lstat: a symlink is not the folder it points to)
    owned by this user (os.geteuid()) and not writable by its group or by others, and
  - each file the action reads (`RUN_FILES` unless told: state.json, plan.json, spec.toml,
    secrets.json, stop.json), when present, is a regular file (lstat: not a symlink, FIFO or
    device) owned by this user or by root (root can write any of the user's files anyway:
    a stop.json an older tunedeck run as root left behind must not lock the user out), and
    not writable by its group or by others.

Write access is read from the mode bits; a POSIX ACL entry that grants write shows in the
group bits (its mask), so it counts too. A run that fails is `foreign` to this user: listed
read-only (another user's runs in a shared home can be watched), never adopted, signalled or
started (`ForeignRun` says why).

What the rule does not rely on: the registry home being private. A home (and runs/) owned by
the user and writable by nobody else keeps others from planting new folders, so the per-file
checks could be skipped there; they are not, because (1) a folder made while the home was still
shared stays its maker's after a chmod, and (2) a private home does not protect a file left
group- or world-writable inside a folder others can traverse. The checks are a few lstat calls;
the registry folds state.json's into the stat it makes anyway (`stat_problem`).

What it cannot see: a shared runs/ without the sticky bit (0777, 2775) lets others rename a
user's run folder away and put their own in its place between the check and the use. Shared
runs folders must be sticky (chmod 1777, or 3775 for a group), as /tmp is.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from collections.abc import Iterable

RUN_FILES = ("state.json", "plan.json", "spec.toml", "secrets.json", "stop.json")
FOLDER = "the run folder"
READ_LIMIT = 4 << 20  # what `read_untrusted` reads at most (state.json is a few KiB)
_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
    stat.S_IFDIR: "a folder",
    stat.S_IFLNK: "a symbolic link",
}


class ForeignRun(ValueError):
    """An action on a run directory that is not this user's (`problem` says why). A
    ValueError, so a verb that refuses bad input in one line refuses this too."""

    def __init__(self, run_dir: Path | str, why: str):
        self.run_dir, self.why = Path(run_dir), why
        super().__init__(
            f"{self.run_dir.name} is another user's run ({why}): tunedeck never "
            f"adopts, stops or signals a run that is not yours"
        )


def user_name(uid: int) -> str:
    """`uid 65534 (nobody)`; just the number when the user database does not know it."""
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, ImportError, OverflowError):
        return f"uid {uid}"


def stat_problem(
    st: os.stat_result, what: str, folder: bool = False, uid: int | None = None
) -> str | None:
    """Why one entry (its lstat result) cannot be trusted, or None. `what` names it in the
    reason ("state.json", FOLDER); `folder`: it must be a directory owned by `uid` (default:
    this process's effective uid), else a regular file owned by `uid` or root."""
    me = os.geteuid() if uid is None else uid
    kind = stat.S_IFMT(st.st_mode)
    want = stat.S_IFDIR if folder else stat.S_IFREG
    if kind != want:
        return f"{what} is {_KINDS.get(kind, 'not a regular file')}"
    owners = (me,) if folder else (me, 0)
    if st.st_uid not in owners:
        return f"{what} is owned by {user_name(st.st_uid)}"
    if st.st_mode & stat.S_IWOTH:
        return f"{what} is writable by others"
    if st.st_mode & stat.S_IWGRP:
        return f"{what} is writable by its group"
    return None


def problem(
    run_dir: Path | str, files: Iterable[str] = RUN_FILES, uid: int | None = None
) -> str | None:
    """Why this user must not act on the run in `run_dir` (one line, e.g. "the run folder is
    owned by uid 65534 (nobody)", "state.json is writable by others"), or None when it is
    theirs. `files`: the names in the folder the caller reads (a missing one is no problem:
    the caller deals with its absence). 1 + len(files) lstat calls, nothing else."""
    path = os.fspath(run_dir)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"{FOLDER} does not exist"
    except OSError as e:
        return f"{FOLDER} cannot be checked ({e.strerror or e})"
    why = stat_problem(st, FOLDER, folder=True, uid=uid)
    if why is not None:
        return why
    for name in files:
        try:
            st = os.lstat(os.path.join(path, name))
        except FileNotFoundError:
            continue
        except OSError as e:
            return f"{name} cannot be checked ({e.strerror or e})"
        why = stat_problem(st, name, uid=uid)
        if why is not None:
            return why
    return None


def check(run_dir: Path | str, files: Iterable[str] = RUN_FILES) -> None:
    """Raise `ForeignRun` unless the run is this user's (`problem`)."""
    why = problem(run_dir, files)
    if why is not None:
        raise ForeignRun(run_dir, why)


def read_untrusted(path: Path | str, limit: int = READ_LIMIT) -> bytes:
    """A file of a run that is not this user's, read for display only: never through a
    symlink (O_NOFOLLOW), never blocking on a FIFO or device (O_NONBLOCK, then it must be a
    regular file), at most `limit` bytes (ValueError past it). OSError when it cannot be
    read."""
    fd = os.open(os.fspath(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
            raise ValueError(f"{Path(path).name} is {kind}")
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, min(1 << 16, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise ValueError(f"{Path(path).name} is larger than {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def root_problem(root: Path) -> str:
    """ "" or one line saying why a runs folder others can write into is unsafe: without the
    sticky bit anyone who can write it can rename a user's run folder away between the check
    and the use (see the module's last paragraph). `ls`, the runs list and `doctor` show it."""
    try:
        st = os.stat(root)
    except OSError:
        return ""
    writable_by_others = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if not writable_by_others or st.st_mode & stat.S_ISVTX:
        return ""
    who = "others" if st.st_mode & stat.S_IWOTH else "its group"
    return (
        f"{root} is writable by {who} without the sticky bit (mode "
        f"{stat.S_IMODE(st.st_mode):04o}): another user could swap a run folder for their own; "
        f"run `chmod +t {root}` (a shared runs folder is 1777, or 3775 for a group)"
    )
