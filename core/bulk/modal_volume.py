"""``volume://NAME/PATH`` as ``--input`` or ``--output`` of ``--on modal``: a file on the Modal Volume NAME,
read and written from the machine that runs the job, through the Modal client's documented Volume calls
(``modal.Volume.from_name``, ``listdir``, ``read_file``, ``batch_upload`` / ``put_file``).

The input is fetched once into ``cache_dir/volumes/NAME/PATH`` (streamed to disk; fetched again only when the
Volume's file changed size or time), and the job reads that copy as it reads a local file. The output is written
as a local job writes it (parts in a work folder beside ``cache_dir/volumes/NAME/PATH``, resumable, then the
merge), and the finished file is uploaded to the Volume; a finished job run again uploads nothing unless the
Volume's copy is missing or differs in size. The containers never mount the Volume: they receive texts
(``embed_shard``) as for any other input."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable

from core.bulk.job import JobError, JobOptions

SCHEME = "volume://"
# Modal's object names: letters, digits, '-', '_', '.'; under 64 characters
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,63}$")


def is_volume(uri: str | None) -> bool:
    return bool(uri) and uri.startswith(SCHEME)


@dataclass(frozen=True)
class VolumePath:
    name: str  # the Volume's name
    path: str  # the file inside it, from its root ("/corpus.parquet")

    def __str__(self) -> str:
        return f"{SCHEME}{self.name}{self.path}"


def parse(uri: str, flag: str) -> VolumePath:
    """``volume://NAME/PATH`` → (NAME, /PATH); a clear error for anything else."""
    name, _, path = uri[len(SCHEME):].partition("/")
    parts = PurePosixPath(path).parts if path else ()
    if not _NAME.match(name) or not parts or path.endswith("/") or any(p in ("..", ".") for p in parts):
        raise JobError(f"{flag} {uri}: expected volume://NAME/PATH, a file on the Modal Volume NAME (letters, "
                       "digits, '-', '_' or '.') at PATH (no '..', not a folder)")
    return VolumePath(name, "/" + "/".join(parts))


def local_copy(cache_dir: str | Path, where: VolumePath) -> Path:
    """Where this machine keeps the file of ``where`` (the input's copy, the output before its upload)."""
    return Path(cache_dir) / "volumes" / where.name / where.path.lstrip("/")


def refuse_off_modal(options: JobOptions, runner: str) -> None:
    """``volume://`` is read and written by ``--on modal`` only."""
    for flag, uri in (("--input", options.input), ("--output", options.output)):
        if is_volume(uri):
            raise JobError(f"{flag} {uri}: a Modal Volume is read and written by --on modal; with --on {runner}, "
                           "copy the file with `modal volume get` / `modal volume put`")


def refuse_same_volume_file(options: JobOptions) -> None:
    """A ``volume://`` output naming the input's file (however spelled) is refused before anything is
    fetched: its upload would replace the corpus on the Volume. Local paths are checked by the job itself
    (core/bulk/workfolder.py), on the copies this machine runs."""
    if is_volume(options.input) and is_volume(options.output):
        if parse(options.input, "--input") == parse(options.output, "--output"):
            raise JobError(f"--output {options.output} is the input file ({options.input}); the output never "
                           "replaces the input: name another --output")


class VolumeFiles:
    """The job's input and output where either is on a Volume. ``volume_of(name)``: the Volume's handle
    (``modal.Volume.from_name``)."""

    def __init__(self, options: JobOptions, cache_dir: str | Path, volume_of: Callable[[str], Any]) -> None:
        self.options = options
        self._volume_of = volume_of
        self._volumes: dict[str, Any] = {}
        self.input = parse(options.input, "--input") if is_volume(options.input) else None
        self.output = parse(options.output, "--output") if is_volume(options.output) else None
        replaced = {}
        if self.input is not None:
            replaced["input"] = str(local_copy(cache_dir, self.input))
        if self.output is not None:
            replaced["output"] = str(local_copy(cache_dir, self.output))
        #: the job as this machine runs it: the local copies in place of the volume:// URIs
        self.local_options = dataclasses.replace(options, **replaced)

    def volume(self, name: str):
        if name not in self._volumes:
            self._volumes[name] = self._volume_of(name)
        return self._volumes[name]

    def _entry(self, where: VolumePath):
        """The Volume's entry for ``where`` (size, mtime), or None."""
        from core.errors import require

        modal = require("modal", "modal")
        try:
            entries = self.volume(where.name).listdir(where.path)
        except modal.exception.NotFoundError:
            return None
        files = [e for e in entries if e.type == modal.volume.FileEntryType.FILE]
        return files[0] if len(files) == 1 else None

    def fetch_input(self) -> int:
        """The input's copy, fetched unless an earlier run fetched this version. Returns the bytes read."""
        if self.input is None:
            return 0
        entry = self._entry(self.input)
        if entry is None:
            raise JobError(f"--input {self.input}: no such file on the Volume {self.input.name!r}")
        target = Path(self.local_options.input)
        stamp = target.with_name(target.name + ".source.json")
        version = {"volume": self.input.name, "path": self.input.path, "size": entry.size, "mtime": entry.mtime}
        if target.exists() and stamp.exists() and json.loads(stamp.read_text()) == version:
            return 0
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".tmp")
        read = 0
        with open(partial, "wb") as out:
            for block in self.volume(self.input.name).read_file(self.input.path):
                out.write(block)
                read += len(block)
        if read != entry.size:
            raise JobError(f"--input {self.input}: read {read} bytes of {entry.size}; run the command again")
        os.replace(partial, target)
        stamp.write_text(json.dumps(version))
        return read

    def publish_output(self) -> bool:
        """The finished output uploaded to its Volume, unless the Volume holds a file of its size there."""
        if self.output is None:
            return False
        local = Path(self.local_options.output)
        entry = self._entry(self.output)
        if entry is not None and entry.size == local.stat().st_size:
            return False
        with self.volume(self.output.name).batch_upload(force=True) as batch:
            batch.put_file(str(local), self.output.path)
        return True
