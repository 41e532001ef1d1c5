"""A Hugging Face Hub without the Hub: a cache laid out as ``huggingface_hub`` writes one, and a stand-in
HTTP server on loopback answering the requests ``huggingface_hub`` makes (``HF_ENDPOINT``).

Both are built from the files of a real model folder. A *repository* here is ``{revision name: commit}``
plus ``{commit: {path in repo: bytes | Path}}``."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from benchmarks.loopback import Handler, LoopbackServer

#: files stored through LFS on the Hub (their ETag is the sha256 of the content, announced as X-Linked-Etag)
LFS_SUFFIXES = (".safetensors", ".bin", ".onnx", ".onnx_data", ".pt", ".model")


def folder_files(folder: Path) -> dict[str, Path]:
    """Every file of ``folder`` by its path inside it (posix)."""
    return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}


def commit_of(label: str) -> str:
    """A 40-hex commit hash, derived from ``label`` (stable across runs)."""
    return hashlib.sha1(label.encode()).hexdigest()


def _read(source: bytes | Path) -> bytes:
    return source if isinstance(source, bytes) else Path(source).read_bytes()


@dataclass
class Blob:
    path: str
    source: bytes | Path
    size: int
    git_oid: str  # git's blob sha1
    sha256: str | None  # set for LFS files

    @property
    def etag(self) -> str:
        return self.sha256 or self.git_oid

    @classmethod
    def of(cls, path: str, source: bytes | Path) -> "Blob":
        data = _read(source)
        lfs = path.endswith(LFS_SUFFIXES)
        git_oid = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        return cls(path, source, len(data), git_oid, hashlib.sha256(data).hexdigest() if lfs else None)


@dataclass
class Repo:
    refs: dict[str, str]  # revision name → commit
    commits: dict[str, dict[str, Blob]] = field(default_factory=dict)
    #: paths listed by the Hub whose download answers 404 (a file missing from storage)
    missing: set[str] = field(default_factory=set)

    @classmethod
    def build(cls, revisions: dict[str, dict[str, bytes | Path]], *, missing: set[str] = frozenset()) -> "Repo":
        """``revisions``: revision name → files; each gets a commit derived from its name and content."""
        refs, commits = {}, {}
        for name, files in revisions.items():
            blobs = {p: Blob.of(p, src) for p, src in files.items()}
            commit = commit_of(name + "".join(b.etag for b in blobs.values()))
            refs[name] = commit
            commits[commit] = blobs
        return cls(refs, commits, set(missing))

    def commit(self, revision: str) -> str | None:
        return revision if revision in self.commits else self.refs.get(revision)


def write_cache(cache_dir: Path, repo_id: str, repo: Repo) -> Path:
    """Lay ``repo`` out in ``cache_dir`` (an ``HF_HUB_CACHE``) exactly as ``huggingface_hub`` does:
    ``models--org--name/blobs/<etag>`` (the content), ``snapshots/<commit>/<path>`` (relative symlinks
    to the blobs) and ``refs/<revision>`` (the commit, no newline). Returns the repository's folder."""
    storage = cache_dir / ("models--" + repo_id.replace("/", "--"))
    (storage / "blobs").mkdir(parents=True, exist_ok=True)
    for name, commit in repo.refs.items():
        ref = storage / "refs" / name
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit)
    for commit, blobs in repo.commits.items():
        for path, blob in blobs.items():
            target = storage / "blobs" / blob.etag
            if not target.exists():
                if isinstance(blob.source, Path):
                    try:
                        os.link(blob.source, target)
                    except OSError:
                        shutil.copyfile(blob.source, target)
                else:
                    target.write_bytes(blob.source)
            link = storage / "snapshots" / commit / path
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.is_symlink():
                link.symlink_to(os.path.relpath(target, link.parent))
    return storage


class HubStandIn:
    """``HF_ENDPOINT=http://127.0.0.1:PORT``: model info, tree listing and file resolution for ``repos``.
    ``requests`` records every (method, path) served, so tests can see which files were fetched."""

    def __init__(self, repos: dict[str, Repo]):
        self.repos = repos
        self.requests: list[tuple[str, str]] = []
        stand_in = self

        class HubHandler(Handler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                stand_in._serve(self, body=True)

            def do_HEAD(self):
                stand_in._serve(self, body=False)

        self._http = LoopbackServer(HubHandler, name="hub")
        self.endpoint = self._http.url

    def __enter__(self) -> "HubStandIn":
        self._http.start()
        return self

    def __exit__(self, *exc) -> None:
        self._http.close()

    def fetched(self) -> set[str]:
        """Paths inside repositories whose content was downloaded (GET …/resolve/…)."""
        out = set()
        for method, path in self.requests:
            parts = path.split("/")
            if method == "GET" and len(parts) > 5 and parts[3] == "resolve":
                out.add("/".join(parts[5:]))
        return out

    # --- the routes -----------------------------------------------------------------------------
    def _serve(self, h: Handler, *, body: bool) -> None:
        url = urlsplit(h.path)
        path = unquote(url.path)
        self.requests.append((h.command, path))
        parts = path.strip("/").split("/")
        try:
            if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
                self._api(h, "/".join(parts[2:4]), parts[4], unquote(parts[5]), body=body)
            elif len(parts) >= 5 and parts[2] == "resolve":
                self._resolve(h, "/".join(parts[:2]), unquote(parts[3]), "/".join(parts[4:]), body=body)
            else:
                self._error(h, 404, "RepoNotFound", "no such route")
        except BrokenPipeError:
            pass

    def _error(self, h, status: int, code: str, message: str) -> None:
        h.reply(status, json.dumps({"error": message}).encode(),
                {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"},
                send_body=h.command != "HEAD")

    def _json(self, h, obj, *, body: bool) -> None:
        h.reply(200, json.dumps(obj).encode(), {"Content-Type": "application/json"}, send_body=body)

    def _lookup(self, h, repo_id: str, revision: str):
        repo = self.repos.get(repo_id)
        if repo is None:
            self._error(h, 404, "RepoNotFound", f"Repository not found: {repo_id}")
            return None, None
        commit = repo.commit(revision)
        if commit is None:
            self._error(h, 404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None, None
        return repo, commit

    def _api(self, h, repo_id: str, kind: str, revision: str, *, body: bool) -> None:
        repo, commit = self._lookup(h, repo_id, revision)
        if repo is None:
            return
        blobs = repo.commits[commit]
        if kind == "revision":
            self._json(h, {"_id": commit[:24], "id": repo_id, "modelId": repo_id, "sha": commit, "private": False,
                           "disabled": False, "gated": False, "tags": [], "downloads": 0, "likes": 0,
                           "lastModified": "2026-01-01T00:00:00.000Z",
                           "siblings": [{"rfilename": p} for p in sorted(blobs)]}, body=body)
            return
        entries, folders = [], set()
        for p, blob in sorted(blobs.items()):
            for i in range(1, p.count("/") + 1):
                folders.add("/".join(p.split("/")[:i]))
            entry = {"type": "file", "oid": blob.git_oid, "size": blob.size, "path": p}
            if blob.sha256:
                entry["lfs"] = {"oid": blob.sha256, "size": blob.size, "pointerSize": 134}
            entries.append(entry)
        entries += [{"type": "directory", "oid": commit_of(d), "size": 0, "path": d} for d in sorted(folders)]
        self._json(h, entries, body=body)

    def _resolve(self, h, repo_id: str, revision: str, file: str, *, body: bool) -> None:
        repo, commit = self._lookup(h, repo_id, revision)
        if repo is None:
            return
        blob = repo.commits[commit].get(file)
        if blob is None or file in repo.missing:
            self._error(h, 404, "EntryNotFound", f"{file} does not exist on {revision!r}")
            return
        headers = {"X-Repo-Commit": commit, "ETag": f'"{blob.etag}"', "Content-Type": "application/octet-stream"}
        if blob.sha256:
            headers.update({"X-Linked-Etag": f'"{blob.sha256}"', "X-Linked-Size": str(blob.size)})
        h.reply(200, _read(blob.source), headers, send_body=body)
