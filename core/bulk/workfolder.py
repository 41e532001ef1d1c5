"""The bulk job's work folder: whose it is, who runs in it, and what the job may delete there.

A work folder is the job's when the job made it, or when it was empty when named: either way the job writes
its marker (:data:`MARKER`, naming the job's input and output) into it first. A folder that holds anything
and no marker is refused, so the job never writes into, or deletes from, a folder of someone else's. One
job at a time runs in a folder: it holds an ``fcntl`` lock on :data:`LOCK` (which names its PID) for the
whole run, and a second job is refused with the folder and that PID. When the output is whole, the job
deletes the files it writes (:func:`is_job_file`) and nothing else, and the folder itself only if the job
made it and it is then empty.

The paths are checked before any of that (:func:`refuse_crossed_paths`): the output never replaces the
input, whatever the spelling (``./../x/in.parquet``, a symlink, a hard link), and neither lies in the
work folder."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import posixpath
import re
from pathlib import Path
from urllib.parse import urlsplit

from core.bulk.errors import JobError

#: written first into a folder the job takes: names the job, says whether the job made the folder
MARKER = "tessera-work.json"
#: the lock a running job holds (``fcntl.flock``, exclusive); it holds the holder's PID
LOCK = "tessera-work.lock"
#: the other files the job writes (its description, its model, the done mark, its repeats store and SQLite's
#: files beside it); parts are named as :data:`PART_NAME`, and anything written atomically has a ``.tmp`` first
JOB_FILES = frozenset({"job.json", "model.json", "complete.json", "vectors.sqlite", "vectors.sqlite-wal",
                       "vectors.sqlite-shm", "vectors.sqlite-journal"})
PART_NAME = re.compile(r"part-\d{12}-\d{12}\.parquet")


def is_job_file(name: str) -> bool:
    """Whether ``name`` is one of the files the job writes in its work folder (its marker and lock apart)."""
    name = name.removesuffix(".tmp")
    return name in JOB_FILES or PART_NAME.fullmatch(name) is not None


class WorkFolder:
    """A work folder taken by this job, locked until :meth:`release` (or :meth:`remove`, once the output is
    whole). Take one with :meth:`take`."""

    def __init__(self, path: Path, created: bool, lock_fd: int) -> None:
        self.path = path
        self.created = created  # the job made the folder: it may remove it, once emptied of its own files
        self._lock_fd: int | None = lock_fd

    @classmethod
    def take(cls, path: Path, *, input: str, output: str, description: dict) -> "WorkFolder":
        """The folder at ``path`` for the job of ``input`` and ``output``: made if missing, locked, marked.
        Refused: a file, a folder holding files and no marker, a marker of another output, a running job.
        A folder without a marker that holds only the job's own files, its ``job.json`` this ``description``
        (a run of this job by a version that wrote no marker), is taken as the job's, not as made by it."""
        created = _make(path)
        marker = path / MARKER
        if not created and not marker.exists():
            _refuse_foreign(path, description)
        fd = _lock(path)
        try:
            if marker.exists():
                _check_marker(path, marker, output)
            else:
                _refuse_foreign(path, description)  # again, under the lock: a job may have been writing it
                _write_marker(marker, {"input": input, "output": output, "created": created})
            created = json.loads(marker.read_text()).get("created", False) is True
        except BaseException:
            os.close(fd)
            raise
        folder = cls(path, created, fd)
        folder.drop_partial_writes()
        return folder

    def drop_partial_writes(self) -> None:
        """The job's own ``.tmp`` files a killed run left (whole files are renamed from them)."""
        for stray in self.path.glob("*.tmp"):
            if is_job_file(stray.name):
                stray.unlink(missing_ok=True)

    def remove(self) -> None:
        """The output is whole: the job's files go (its marker and lock last), the folder too if the job made
        it and nothing else is left in it. Releases the lock."""
        for entry in self.path.iterdir():
            if is_job_file(entry.name) and entry.is_file() and not entry.is_symlink():
                entry.unlink(missing_ok=True)
        for name in (MARKER + ".tmp", MARKER):
            (self.path / name).unlink(missing_ok=True)
        (self.path / LOCK).unlink(missing_ok=True)  # a job waiting on this file finds it gone (see _lock)
        self.release()
        if self.created:
            try:
                self.path.rmdir()
            except OSError as exc:  # something not the job's is in it (or a new job took it): it stays
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                    raise

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None


def _make(path: Path) -> bool:
    """Make the folder; True when this call made it (False: it was there)."""
    if path.exists() and not path.is_dir():
        raise JobError(f"work folder {path}: exists and is not a folder; name a new or empty folder")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir()
    except FileExistsError:
        return False
    return True


#: what a job killed while taking a folder leaves in it before its marker
_TAKING = frozenset({LOCK, MARKER + ".tmp"})


def _refuse_foreign(path: Path, description: dict) -> None:
    foreign = sorted(entry.name for entry in path.iterdir() if entry.name not in _TAKING)
    if foreign and all(is_job_file(name) for name in foreign) and "job.json" in foreign:
        if _recorded_job(path) == description:
            return
        raise JobError(f"work folder {path}: holds part of another job (its job.json differs) and no {MARKER}; "
                              "remove the folder to start this one, or name another --work-dir")
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise JobError(f"work folder {path}: holds files this job did not write ({shown}) and no {MARKER}; "
                              "name a new or empty folder with --work-dir (the job writes and deletes only its own "
                              "files there)")


def _recorded_job(path: Path) -> dict | None:
    try:
        return json.loads((path / "job.json").read_text())
    except (OSError, ValueError):
        return None


def _check_marker(path: Path, marker: Path, output: str) -> None:
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError) as exc:
        raise JobError(f"work folder {path}: its {MARKER} is unreadable ({exc}); remove the folder to "
                              "start again") from None
    if recorded.get("output") != output:
        raise JobError(f"work folder {path}: it is the work folder of the job writing "
                              f"{recorded.get('output')!r}, not {output!r}; name another --work-dir")


def _write_marker(marker: Path, content: dict) -> None:
    tmp = marker.with_name(marker.name + ".tmp")
    tmp.write_text(json.dumps(content, sort_keys=True))
    os.replace(tmp, marker)


def _lock(path: Path) -> int:
    """An exclusive ``flock`` on ``path/LOCK``, with this process's PID written in it; refused at once (with
    the holder's PID) when another job holds it. The file is opened again if a finishing job removed it
    between our open and our lock, so the lock is always on the file the folder holds."""
    lock_path = path / LOCK
    for _ in range(8):
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:
            raise JobError(f"work folder {path}: removed by the job that finished in it; run the command "
                                  "again") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip()
            os.close(fd)
            raise JobError(f"work folder {path}: another job is running in it"
                                  + (f" (PID {holder})" if holder else "")
                                  + "; wait for it to finish, or name another --work-dir") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock_path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
            return fd
        os.close(fd)
    raise JobError(f"work folder {path}: its lock file keeps being replaced; is another job starting there?")


# --- paths that must not cross ----------------------------------------------------------------------------


def _local(path: str) -> Path | None:
    """A local path's absolute form (``file://`` URIs included), symlinks resolved; None for a remote URI."""
    if "://" in path:
        parts = urlsplit(path)
        if parts.scheme != "file":
            return None
        path = parts.path
    return Path(os.path.abspath(path)).resolve()


def _remote(uri: str) -> str:
    """A remote URI spelled one way: ``s3://b/./k//x`` and ``s3://b/k/x`` are one object."""
    parts = urlsplit(uri)
    return f"{parts.scheme.lower()}://{parts.netloc}{posixpath.normpath('/' + parts.path)}"


def same_file(a: str, b: str) -> bool:
    """Whether two paths (or URIs) name one file: the same resolved path, or (both existing) the same inode."""
    local_a, local_b = _local(a), _local(b)
    if local_a is None or local_b is None:
        return local_a is None and local_b is None and _remote(a) == _remote(b)
    if local_a == local_b:
        return True
    try:
        return os.path.samefile(local_a, local_b)
    except OSError:  # one of them does not exist (yet)
        return False


def inside(path: str, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or lies under it (local paths; a remote URI never does)."""
    local = _local(path)
    if local is None:
        return False
    base = Path(os.path.abspath(folder)).resolve()
    return local == base or base in local.parents


def refuse_crossed_paths(input: str, output: str, work: Path | None) -> None:
    """The output must not be the input, however spelled, and the work folder must hold neither."""
    if same_file(input, output):
        raise JobError(f"--output {output} is the input file ({input}); the output never replaces the input: "
                              "name another --output")
    if work is None:
        return
    for flag, path in (("--input", input), ("--output", output)):
        if inside(path, work):
            raise JobError(f"{flag} {path} lies in the work folder {work}; name a --work-dir apart from the "
                                  "input and the output")
