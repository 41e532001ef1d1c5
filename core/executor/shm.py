"""Shared-memory arenas: one POSIX shared-memory segment per direction and connection, mapped once, with
a first-fit allocator over it (offsets, not objects), so that a request's token arrays and its results
cross between processes without a copy through the socket and without a ``shm_open`` per request.

``multiprocessing.shared_memory.SharedMemory`` is the same primitive (``shm_open`` + ``mmap``), but on
Python before 3.13 it registers every segment it opens, the attached ones included, with the resource
tracker, which unlinks the segment when the *attaching* process exits and starts a tracker process in
each process that uses one; a segment here has exactly two owners (the front end that created it and the
executor it is connected to), and either unlinks it when the other goes away."""

from __future__ import annotations

import bisect
import mmap
import os
import secrets

import _posixshmem

#: every segment of one executor set is named ``/{prefix}-…`` (``ExecutorSet.stop`` removes what is left)
NAME_PREFIX = "tessera"
#: allocations are aligned to this many bytes (a cache line; numpy views of any dtype stay aligned)
ALIGN = 64


class Segment:
    """One shared-memory segment mapped into this process."""

    def __init__(self, name: str, size: int, *, create: bool):
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = _posixshmem.shm_open("/" + name, flags, mode=0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            else:
                size = os.fstat(fd).st_size
            self.map = mmap.mmap(fd, size)
        except OSError:
            os.close(fd)
            if create:
                unlink(name)
            raise
        os.close(fd)
        self.name = name
        self.size = size

    @classmethod
    def create(cls, prefix: str, size: int) -> "Segment":
        return cls(f"{prefix}-{os.getpid()}-{secrets.token_hex(4)}", size, create=True)

    @classmethod
    def attach(cls, name: str) -> "Segment":
        return cls(name, 0, create=False)

    def unlink(self) -> None:
        unlink(self.name)

    def close(self) -> None:
        """Unmap unless numpy views still hold the memory (they keep it mapped until they go)."""
        try:
            self.map.close()
        except BufferError:
            pass


def unlink(name: str) -> None:
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        pass


class Allocator:
    """First-fit over ``[0, size)``: ``alloc(n)`` → offset or None when no free block fits; ``free(offset)``
    returns the block and merges it with its free neighbours. Blocks are ``ALIGN``-aligned."""

    def __init__(self, size: int):
        self.size = size
        self._starts: list[int] = [0]  # free blocks, sorted by start
        self._ends: dict[int, int] = {0: size}
        self._used: dict[int, int] = {}  # offset → end
        self.in_use = 0

    def alloc(self, nbytes: int) -> int | None:
        need = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        for i, start in enumerate(self._starts):
            end = self._ends[start]
            if end - start >= need:
                del self._ends[start]
                if end - start == need:
                    del self._starts[i]
                else:
                    self._starts[i] = start + need
                    self._ends[start + need] = end
                self._used[start] = start + need
                self.in_use += need
                return start
        return None

    def free(self, offset: int) -> None:
        end = self._used.pop(offset)
        self.in_use -= end - offset
        start = offset
        i = bisect.bisect_left(self._starts, start)
        if i < len(self._starts) and self._starts[i] == end:  # merge with the next free block
            end = self._ends.pop(end)
            del self._starts[i]
        if i > 0 and self._ends[self._starts[i - 1]] == start:  # merge with the previous one
            self._ends[self._starts[i - 1]] = end
            return
        self._starts.insert(i, start)
        self._ends[start] = end
