"""The commands in docs/adapters.md and docs/deploy.md. Every fenced command block either says on its first
line what it needs that a checkout does not have (``# needs ...``: an AWS or Modal account, Docker), or runs
here as written, and then it is run below: from the repository root, with ``python`` the test's own
interpreter, no credentials, and any AWS endpoint pointed at a closed loopback port (a dry run that called
AWS would fail, never reach it). And the Lambda cold-start figure is in one place, with its command and date."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

PAGES = ("docs/adapters.md", "docs/deploy.md")
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/tessera-lambda:arm64"

#: the commands of unmarked blocks that run here, with what each must print (stream, text) and exit with
RUNS_HERE = {
    "python scripts/build_images.py --dry-run": (0, [("out", "tessera-sagemaker:cuda"),
                                                     ("err", "skipped sagemaker-neuron: it needs --neuron-base-image")]),
    "python scripts/build_images.py --dry-run --neuron-base-image DLC": (0, [("out", "BASE_IMAGE=DLC")]),
    "python scripts/deploy.py lambda --image-uri $IMAGE --param MemorySize=99999 --param Bogus=1 --dry-run": (
        1, [("err", "MemorySize=99999: above MaxValue 10240"), ("err", "Bogus: not a parameter of this template")]),
}
#: the test suite's own commands: not run from inside the suite, only their paths checked
SUITE = {".venv/bin/python -m pytest tests/adapters -q": "tests/adapters"}


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
    """The shell commands of a block: continuation lines joined, comments and blank lines left out."""
    out, pending = [], ""
    for raw in lines:
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        full = re.sub(r"\s+#\s.*$", "", pending + line)  # a trailing comment
        out.append(" ".join(full.split()))
        pending = ""
    return out


def unmarked() -> list[tuple[str, int, str, str]]:
    return [(page, number, language, command)
            for page in PAGES for number, language, lines in blocks(page)
            if lines and language in ("bash", "sh", "python", "")
            and not lines[0].startswith("# needs ")
            for command in (commands(lines) if language != "python" else ["<python block>"])]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TESSERA_", "MODAL_"))}
    env.update({"PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", "IMAGE": IMAGE,
                "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_EC2_METADATA_DISABLED": "true",
                "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_CONFIG_FILE": os.devnull})
    env.pop("PYTHONPATH", None)
    return env


def test_every_block_runs_here_or_says_what_it_needs():
    found = unmarked()
    assert found, "no unmarked block: the pages must keep at least their dry runs"
    for page, number, language, command in found:
        assert language == "bash", f"{page}:{number}: a {language or 'plain'} block that does not say what it needs"
        assert command in RUNS_HERE or command in SUITE, (
            f"{page}:{number}: `{command}` is neither run by this test nor marked `# needs ...`")
    assert {c for *_, c in found} == set(RUNS_HERE) | set(SUITE)  # nothing listed here has left the pages


def test_the_pages_mark_what_needs_an_account():
    marks = [lines[0] for page in PAGES for _, _, lines in blocks(page) if lines and lines[0].startswith("# needs ")]
    assert any("AWS account" in m for m in marks) and any("Modal account" in m for m in marks)
    assert any("Docker" in m for m in marks)


@pytest.mark.parametrize("command", sorted(RUNS_HERE))
def test_command_runs_as_written(command):
    code, expected = RUNS_HERE[command]
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    for stream, text in expected:
        assert text in {"out": done.stdout, "err": done.stderr}[stream], (text, done.stdout[-1000:], done.stderr[-1000:])


def test_suite_commands_name_existing_test_folders():
    for command, path in SUITE.items():
        assert command.split()[3] == path and (ROOT / path).is_dir()
        assert (ROOT / command.split()[0]).parent.name == "bin"


@pytest.mark.slow
def test_the_documented_package_command_runs_as_written(tmp_path):
    """docs/deploy.md's local packing of the embedded model, as printed (its output path moved to tmp_path)."""
    page = (ROOT / "docs/deploy.md").read_text()
    [command] = re.findall(r"`(python scripts/package_model\.py \$\(python -c [^`]*)`", page)
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
