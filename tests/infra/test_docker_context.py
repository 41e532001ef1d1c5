"""The build context: `.dockerignore` leaves out tests, docs, environments and build outputs but nothing
any Dockerfile copies; the Lambda image's layers are ordered so that the model is exported again only
when the exporter or the model changes, and only the served int8 graph is baked in."""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest

from .conftest import ROOT
from .test_dockerfiles import DOCKERFILES, instructions

LAMBDA = ROOT / "adapters/lambda/Dockerfile"


def _pattern_regex(pattern: str) -> re.Pattern:
    """A .dockerignore pattern (Go filepath.Match plus `**`, as Docker's patternmatcher reads it)."""
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):  # `**/` : zero or more directories
                i += 1
                out += "(?:.*/)?"
            else:
                out += ".*"
            continue
        out += {"*": "[^/]*", "?": "[^/]"}.get(c, re.escape(c))
        i += 1
    return re.compile(out + r"\Z")


def read_dockerignore() -> list[tuple[bool, re.Pattern]]:
    rules = []
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        line = line.lstrip("!").strip().strip("/")
        rules.append((negate, _pattern_regex(line)))
    return rules


RULES = read_dockerignore()


def excluded(path: str) -> bool:
    """Whether Docker leaves ``path`` (relative to the context root) out: the last rule that matches the
    path or one of its parent folders decides."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    verdict = False
    for negate, regex in RULES:
        if any(regex.match(p) for p in prefixes):
            verdict = not negate
    return verdict


def copy_sources(dockerfile) -> list[str]:
    """The build-context paths each COPY/ADD of every stage reads (``--from`` copies read a stage)."""
    sources = []
    for word, rest in instructions(dockerfile):
        if word not in ("COPY", "ADD") or "--from=" in rest:
            continue
        args = [a for a in shlex.split(rest) if not a.startswith("--")]
        sources += args[:-1]
    return sources


def tracked_files() -> list[str]:
    done = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        pytest.skip("not a git checkout")
    return done.stdout.split()


def test_matcher_reads_patterns_as_docker_does():
    assert _pattern_regex("**/__pycache__").match("core/api/__pycache__")
    assert _pattern_regex("**/__pycache__").match("__pycache__")
    assert _pattern_regex("*.md").match("README.md") and not _pattern_regex("*.md").match("docs/adapters.md")
    assert _pattern_regex("scripts/*").match("scripts/bench.py")


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_nothing_a_dockerfile_copies_is_left_out(dockerfile):
    files = tracked_files()
    sources = copy_sources(ROOT / dockerfile)
    assert sources, f"{dockerfile} copies nothing from the context?"
    for source in sources:
        assert (ROOT / source).exists(), f"{dockerfile}: COPY {source}: no such path"
        assert not excluded(source), f"{dockerfile}: COPY {source} is left out by .dockerignore"
        inside = [f for f in files if f == source or f.startswith(source.rstrip("/") + "/")]
        assert inside, source
        left_out = [f for f in inside if excluded(f)]
        assert not left_out, f"{dockerfile}: COPY {source}: .dockerignore leaves out {left_out[:5]}"


def test_requirements_files_reach_the_build():
    for path in ("adapters/sagemaker/requirements-cuda.txt", "adapters/sagemaker/requirements-neuron.txt",
                 "adapters/lambda/requirements.txt", "adapters/lambda/requirements-export.txt"):
        assert (ROOT / path).is_file() and not excluded(path), path


@pytest.mark.parametrize("path", [
    ".git/HEAD", ".venv/bin/python", "tests/adapters/test_lambda.py", "docs/adapters.md", "infra/lambda/template.yaml",
    "README.md", "core/__pycache__/engine.cpython-311.pyc", "build/lib/core/engine.py", "dist/tessera.whl",
    "model.tar.gz", ".whl/torch.whl", ".bench/run.json", ".pytest_cache/v/x", "scripts/bench.py",
    "tessera.egg-info/PKG-INFO",
])
def test_left_out(path):
    assert excluded(path)


def _stage(name: str) -> list[tuple[str, str]]:
    items = instructions(LAMBDA)
    start = next(i for i, (w, rest) in enumerate(items) if w == "FROM" and rest.endswith(f" AS {name}"))
    end = next((i for i, (w, _) in enumerate(items) if i > start and w == "FROM"), len(items))
    return items[start:end]


def test_lambda_export_depends_on_the_exporter_and_the_model_only():
    stage = _stage("export")
    export_at = next(i for i, (w, rest) in enumerate(stage) if w == "RUN" and "scripts/export_onnx.py" in rest)
    before = [rest for w, rest in stage[:export_at] if w in ("COPY", "ADD")]
    sources = {a for rest in before if "--from=" not in rest for a in shlex.split(rest)[:-1]}
    assert sources == {"adapters/lambda/requirements-export.txt", "pyproject.toml", "core", "scripts/export_onnx.py"}
    # the model comes from its own build context (an empty stage by default), not from a copy of the whole context
    assert [rest for rest in before if rest.startswith("--from=")] == ["--from=model / /context/"]
    assert _stage("model")[0] == ("FROM", "scratch AS model")
    assert not any(w == "COPY" and shlex.split(rest)[0] == "." for w, rest in instructions(LAMBDA))


def test_lambda_image_bakes_only_the_served_graph_before_the_code():
    export_run = next(rest for w, rest in _stage("export") if w == "RUN" and "scripts/export_onnx.py" in rest)
    assert "--int8 fast" in export_run and "rm /export/model/onnx/model.onnx" in export_run
    final = instructions(LAMBDA)
    final = final[max(i for i, (w, _) in enumerate(final) if w == "FROM"):]
    copies = [rest for w, rest in final if w == "COPY"]
    model_at = copies.index("--from=export /export/model /opt/model")
    assert copies.index("core ./core") > model_at
    assert copies.index("adapters/lambda/handler.py ${LAMBDA_TASK_ROOT}/handler.py") > model_at
    env = " ".join(rest for w, rest in final if w == "ENV")
    assert '"path": "/opt/model"' in env and '"dtype": "int8"' in env  # the graph kept is the one served
