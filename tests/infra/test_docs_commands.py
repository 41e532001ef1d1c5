"""Every command of README.md, docs/*.md and docs/*/*.md (the benchmark history and other records). Every
fenced block says what it holds (``bash``, ``python``, ``json``, ``yaml``, ``text``, ``mermaid``); a ``bash``
or ``python`` block either says on its first line what it needs that a checkout set up as the README says
does not have (``# needs ...``: an AWS or Modal account, Docker, a GPU, the Hugging Face Hub, model folders of your own, a benchmark's quiet minutes), or it runs here as written,
and then it is run below: from the repository root, no credentials, any AWS endpoint pointed at a closed
loopback port (a dry run that called AWS would fail, never reach it), a server on loopback for the commands
that call one. Every command, marked or not, names the project's environment (``.venv/bin/python``,
``scripts/...``; never a bare ``python``, ``pip``, ``uvicorn`` or ``pytest``, which outside an activated
environment fail or install into the system Python), and the options it gives exist: each ``--option``
appears in its program's ``--help``. And the Lambda cold-start figure is in one place, with its command and
date."""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess

import pytest

from .conftest import ROOT

PAGES = ("README.md", *sorted(p.relative_to(ROOT).as_posix() for pattern in ("*.md", "*/*.md")
                            for p in (ROOT / "docs").glob(pattern)))
LANGUAGES = {"bash", "python", "json", "yaml", "text", "mermaid"}
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/tessera-lambda:arm64"
PY = ".venv/bin/python"

#: the commands of unmarked blocks that run here, with what each must print (stream, text) and exit with
RUNS_HERE = {
    f"{PY} scripts/build_images.py --dry-run": (0, [("out", "tessera-sagemaker:cuda"),
                                                   ("err", "skipped sagemaker-neuron: it needs --neuron-base-image")]),
    f"{PY} scripts/build_images.py --dry-run --neuron-base-image DLC": (0, [("out", "BASE_IMAGE=DLC")]),
    f"{PY} scripts/deploy.py lambda --image-uri $IMAGE --param MemorySize=99999 --param Bogus=1 --dry-run": (
        1, [("err", "MemorySize=99999: above MaxValue 10240"), ("err", "Bogus: not a parameter of this template")]),
    f"{PY} scripts/cost_table.py --bench docs/bench/compare-int8-sat-default.json --gpu-bench "
    "docs/bench/gpu-bench.json": (0, [("out", "| platform | $ / 1M (long) | $ / 1M (short) | inputs |")]),
}
#: the README's set-up itself (bootstrap, then serve / the suite): not run from inside the suite
SETUP = {"scripts/serve", "scripts/test"}
#: the test suite's own commands: not run from inside the suite, only their paths checked
SUITE = {f"{PY} -m pytest tests/adapters -q": ["tests/adapters"],
         f"{PY} -m pytest tests/multimodal -q": ["tests/multimodal"],
         f"{PY} -m pytest tests/tasks tests/compat -q": ["tests/tasks", "tests/compat"]}
#: commands that call the server `scripts/serve` starts (127.0.0.1:8000): run against one started here
CALLS_THE_SERVER = {
    "curl -s 127.0.0.1:8000/v1/embeddings -H 'content-type: application/json' -d '{\"input\": [\"hello world\", "
    "\"a second text\"]}' | head -c 300": '"embedding"',
}
#: python blocks that run here: (page, what the block's first line says) → what it must print
PYTHON_HERE = {("README.md", "from openai import OpenAI"): "calls the server",
               ("docs/api.md", "import asyncio"): "in process"}
#: bare programs that fail outside an activated environment (or install into the system Python)
BARE = {"python", "python3", "pip", "pip3", "uvicorn", "pytest"}


def blocks(page: str) -> list[tuple[int, str, list[str]]]:
    """(first line number, language, lines) of every fenced block of ``page``."""
    found, current = [], None
    for number, line in enumerate((ROOT / page).read_text().splitlines(), 1):
        if line.startswith("```"):
            if current is None:
                current = (number, line[3:].strip(), [])
            else:
                found.append(current)
                current = None
        elif current is not None:
            current[2].append(line)
    assert current is None, f"{page}: an unclosed code block at line {current[0]}"
    return found


def commands(lines: list[str]) -> list[str]:
    """The shell commands of a block: continuation lines and quoted strings over several lines joined,
    comments and blank lines left out."""
    out, pending = [], ""
    for raw in lines:
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        full = pending + line
        try:
            shlex.split(full, comments=True)
        except ValueError:  # an open quote: the string goes on on the next line
            pending = full + " "
            continue
        full = re.sub(r"\s+#\s.*$", "", full)  # a trailing comment
        out.append(" ".join(full.split()))
        pending = ""
    assert not pending, f"an unfinished command: {pending!r}"
    return out


def all_blocks() -> list[tuple[str, int, str, list[str]]]:
    return [(page, number, language, lines) for page in PAGES for number, language, lines in blocks(page)]


def marked(lines: list[str]) -> bool:
    return bool(lines) and lines[0].startswith("# needs ")


def unmarked() -> list[tuple[str, int, str, str]]:
    return [(page, number, language, command)
            for page, number, language, lines in all_blocks()
            if lines and language in ("bash", "python") and not marked(lines)
            for command in (commands(lines) if language == "bash" else [lines[0]])]


def every_command() -> list[tuple[str, int, str]]:
    return [(page, number, command) for page, number, language, lines in all_blocks() if language == "bash"
            for command in commands(lines)]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TESSERA_", "MODAL_"))}
    env.update({"IMAGE": IMAGE, "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_EC2_METADATA_DISABLED": "true",
                "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_CONFIG_FILE": os.devnull,
                # the checkout's own code (what the editable install of the README's set-up points at)
                "PYTHONPATH": str(ROOT)})
    return env


def test_every_block_says_what_it_holds():
    for page, number, language, lines in all_blocks():
        assert language in LANGUAGES, f"{page}:{number}: a block marked {language or 'nothing'!r}: say bash, " \
                                      "python, json, yaml, text or mermaid"


def test_every_block_runs_here_or_says_what_it_needs():
    found = unmarked()
    assert found, "no unmarked block: the pages must keep at least their dry runs"
    known = set(RUNS_HERE) | SETUP | set(SUITE) | set(CALLS_THE_SERVER)
    for page, number, language, command in found:
        if language == "python":
            assert (page, command) in PYTHON_HERE, f"{page}:{number}: a python block neither run here nor marked"
            continue
        assert command in known, f"{page}:{number}: `{command}` is neither run by this test nor marked `# needs ...`"
    assert {c for *_, lang, c in found if lang == "bash"} == known  # nothing listed here has left the pages
    assert {(p, c) for p, _, lang, c in found if lang == "python"} == set(PYTHON_HERE)


def test_the_pages_mark_what_needs_an_account():
    marks = [lines[0] for *_, lines in all_blocks() if marked(lines)]
    assert any("AWS account" in m for m in marks) and any("Modal account" in m for m in marks)
    assert any("Docker" in m for m in marks)


def _segments(command: str) -> list[list[str]]:
    """The simple commands of a command line (split at &&, ||, |, ;), each without its VAR=value prefixes."""
    words = shlex.split(command.replace("$(", "$( "), comments=True)
    out, current = [], []
    for word in words:
        if word in ("&&", "||", "|", ";"):
            out.append(current)
            current = []
        else:
            current.append(word)
    out.append(current)
    cleaned = []
    for seg in out:
        while seg and (re.match(r"^[A-Z_][A-Z0-9_]*=", seg[0]) or seg[0] in ("export", "nice", "$(")):
            seg = seg[1:]
        if seg:
            cleaned.append(seg)
    return cleaned


@functools.lru_cache(maxsize=None)
def help_text(*program: str) -> str:
    done = subprocess.run([*program, "--help"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, (program, done.stderr[-2000:])
    return done.stdout


def _program(seg: list[str]) -> tuple[tuple[str, ...] | None, list[str]]:
    """(the program whose --help lists the options, the arguments), None when there is nothing to check."""
    head = seg[0]
    if head == PY and len(seg) > 1:
        if seg[1].startswith("scripts/") and seg[1].endswith(".py"):
            assert (ROOT / seg[1]).is_file(), seg[1]
            return (PY, seg[1]), seg[2:]
        if seg[1:3] == ["-m", "core"] and len(seg) > 3:
            if seg[3] == "batch-transform" and len(seg) > 4:  # its own subcommands: prepare, collect
                return (PY, "-m", "core", *seg[3:5]), seg[5:]
            sub = "serve" if seg[3] in ("v1", "v2") or seg[3].startswith("-") else seg[3]
            return (PY, "-m", "core", sub), seg[4:]
        if seg[1:3] == ["-m", "pytest"]:
            for arg in seg[3:]:
                if not arg.startswith("-"):
                    assert (ROOT / arg).exists(), arg
            return None, []
    if head == ".venv/bin/tessera":
        sub = "serve" if len(seg) == 1 or seg[1] in ("v1", "v2") or seg[1].startswith("-") else seg[1]
        return (PY, "-m", "core", sub), seg[1:]
    if head.startswith("scripts/") or (head == "bash" and len(seg) > 1 and seg[1].startswith("scripts/")):
        path = seg[1] if head == "bash" else head
        assert (ROOT / path).is_file(), path
        return None, []
    return None, []


@pytest.mark.parametrize("page, number, command", every_command(),
                         ids=[f"{p}:{n}:{c[:40]}" for p, n, c in every_command()])
def test_commands_name_the_environment_and_options_that_exist(page, number, command):
    for seg in _segments(command):
        assert seg[0] not in BARE, (f"{page}:{number}: `{command}` runs a bare {seg[0]!r}: outside an activated "
                                    f"environment it fails (write {PY} -m ... or the script's path)")
        program, args = _program(seg)
        if program is None:
            continue
        text = help_text(*program)
        for arg in args:
            option = arg.lstrip("[").split("=", 1)[0].rstrip("]")
            if option.startswith("--"):
                assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text), (
                    f"{page}:{number}: {option} is not an option of {' '.join(program)}")


@pytest.mark.parametrize("command", sorted(RUNS_HERE))
def test_command_runs_as_written(command):
    code, expected = RUNS_HERE[command]
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    for stream, text in expected:
        assert text in {"out": done.stdout, "err": done.stderr}[stream], (text, done.stdout[-1000:], done.stderr[-1000:])


def test_suite_and_setup_commands_exist():
    for command, paths in SUITE.items():
        assert command.startswith(f"{PY} -m pytest ") and all((ROOT / p).is_dir() for p in paths)
        assert command.split()[3:3 + len(paths)] == paths
    for command in SETUP:
        assert os.access(ROOT / command, os.X_OK), command


def _python_block(page: str, first_line: str) -> str:
    for number, language, lines in blocks(page):
        if language == "python" and lines and lines[0] == first_line:
            return "\n".join(lines)
    raise AssertionError(f"{page}: no python block starting {first_line!r}")


@pytest.fixture(scope="module")
def readme_server(tmp_path_factory):
    """What `scripts/serve` starts after its set-up (`.venv/bin/python -m core serve`: the embedded model),
    on a free port; the commands that call 127.0.0.1:8000 are pointed at it."""
    from tests.support.server import free_port, running_process

    port = free_port()
    env = {**_env(), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TESSERA_THREADS": "2",
           "TESSERA_CACHE_DIR": str(tmp_path_factory.mktemp("docs-cache"))}
    with running_process([PY, "-m", "core", "serve", "--port", str(port)], env, port=port, timeout=300,
                         name="docs-readme") as (base, _proc):
        yield port, env


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(CALLS_THE_SERVER))
def test_commands_that_call_the_server_run_as_written(command, readme_server):
    port, env = readme_server
    done = subprocess.run(["bash", "-c", command.replace("127.0.0.1:8000", f"127.0.0.1:{port}")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and CALLS_THE_SERVER[command] in done.stdout, done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("page, first_line", sorted(PYTHON_HERE))
def test_python_blocks_run_as_written(page, first_line, readme_server):
    port, env = readme_server
    code = _python_block(page, first_line).replace("127.0.0.1:8000", f"127.0.0.1:{port}")
    done = subprocess.run([PY, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_the_documented_package_command_runs_as_written(tmp_path):
    """docs/deploy.md's local packing of the embedded model, as printed (its output path moved to tmp_path)."""
    page = (ROOT / "docs/deploy.md").read_text()
    [command] = re.findall(r"`(\.venv/bin/python scripts/package_model\.py \$\(\.venv/bin/python -c [^`]*)`", page)
    assert command.endswith("--output /tmp/model.tar.gz")
    target = tmp_path / "model.tar.gz"
    done = subprocess.run(["bash", "-c", command.replace("/tmp/model.tar.gz", str(target))], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"wrote {target}" in done.stdout and target.stat().st_size > 10_000_000


def _paragraphs(text: str) -> list[str]:
    """Paragraphs, list items and table rows."""
    return [p for p in re.split(r"\n\s*\n|\n(?=\s*- )|\n(?=\|)", text) if p.strip()]


def test_the_lambda_cold_start_figure_is_in_one_place():
    """One measured figure, with its command and date, in docs/benchmarks.md; the other pages link to it
    and quote no figure of their own."""
    bench = (ROOT / "docs/benchmarks.md").read_text()
    section = bench.split("\n## Lambda cold start\n", 1)[1].split("\n## ", 1)[0]
    assert "scripts/coldstart_lambda.py --runs" in section and re.search(r"\b20\d\d-\d\d-\d\d\b", section)
    assert re.search(r"median \| \*\*\d+ ms\*\*", section)
    figure = re.compile(r"(?<![\d.])(?<!≤ )\d+(?:\.\d+)?\s?(?:ms|s)\b")  # a duration, not a target (≤ 1.5 s)
    pages = [p for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "benchmarks.md"] + [ROOT / "README.md"]
    for page in pages:
        for paragraph in _paragraphs(page.read_text()):
            if "lambda" in paragraph.lower() and "cold start" in paragraph.lower():
                assert not figure.search(paragraph), f"{page.name}: a cold-start figure of its own: {paragraph[:200]}"
    for name in ("adapters.md", "deploy.md"):
        assert "benchmarks.md#lambda-cold-start" in (ROOT / "docs" / name).read_text(), name
    outside = [p for p in _paragraphs(bench) if "cold start" in p.lower() and "lambda" in p.lower()
               and p not in section and figure.search(p)]
    assert not outside, outside


def _aws_commands(page: str, service: str, operation: str) -> list[dict[str, str | bool]]:
    """``aws SERVICE OPERATION --opt value --flag ...`` commands of ``page``'s bash blocks, continuation
    lines joined, each as {option: value or True}."""
    import shlex

    found = []
    for _, language, lines in blocks(page):
        if language != "bash":
            continue
        text = "\n".join(lines).replace("\\\n", " ")
        for line in text.splitlines():
            words = shlex.split(line, comments=True)
            if words[:3] != ["aws", service, operation]:
                continue
            options: dict[str, str | bool] = {}
            rest = words[3:]
            while rest:
                key = rest.pop(0)
                assert key.startswith("--"), (line, key)
                options[key[2:]] = rest.pop(0) if rest and not rest[0].startswith("--") else True
            found.append(options)
    return found


def test_manual_public_function_url_grants_both_actions():
    """AWS, "Control access to Lambda function URLs": since October 2025 a new function URL needs both
    lambda:InvokeFunctionUrl and lambda:InvokeFunction; for auth type NONE the second is granted to '*'
    only for calls through the URL (AddPermission's InvokedViaFunctionUrl). The manual CLI path in
    docs/adapters.md grants the same pair as the template's PublicUrlPermission / PublicInvokePermission,
    and every option it uses is a parameter of AddPermission in AWS's API model (botocore)."""
    import botocore.session

    from .conftest import LAMBDA_TEMPLATE, parse_template

    grants = _aws_commands("docs/adapters.md", "lambda", "add-permission")
    by_action = {g["action"]: g for g in grants}
    assert set(by_action) == {"lambda:InvokeFunctionUrl", "lambda:InvokeFunction"}, grants
    assert by_action["lambda:InvokeFunctionUrl"]["function-url-auth-type"] == "NONE"
    assert by_action["lambda:InvokeFunction"].get("invoked-via-function-url") is True
    assert all(g["principal"] == "*" for g in grants)
    members = botocore.session.get_session().get_service_model("lambda").operation_model(
        "AddPermission").input_shape.members
    for grant in grants:
        for option in grant:
            assert "".join(part.capitalize() for part in option.split("-")) in members, option
    template = parse_template(LAMBDA_TEMPLATE)["Resources"]
    granted = {(r["Properties"]["Action"], r["Properties"].get("FunctionUrlAuthType"),
                r["Properties"].get("InvokedViaFunctionUrl")) for r in template.values()
               if r["Type"] == "AWS::Lambda::Permission"}
    assert granted == {("lambda:InvokeFunctionUrl", "NONE", None), ("lambda:InvokeFunction", None, True)}
