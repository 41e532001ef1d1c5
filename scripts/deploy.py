#!/usr/bin/env python
"""Create or update a Tessera deployment and wait until it serves.

    python scripts/deploy.py lambda    --image-uri URI [--stack-name tessera] [--param Key=Value ...]
    python scripts/deploy.py sagemaker --bucket BUCKET [--params-file infra/sagemaker/params-cuda.json]
                                       [--stack-name tessera-sm] [--param Key=Value ...]
    python scripts/deploy.py modal     [--env-file infra/modal/tessera.env] [--env TESSERA_MODAL_GPU=L4 ...]
    ... --dry-run     print every AWS call (and the modal command) instead of making it; no credentials needed

lambda / sagemaker: one CloudFormation stack from infra/ (``create_stack`` when it does not exist, else
``update_stack``), with ``CAPABILITY_IAM`` (+ ``CAPABILITY_AUTO_EXPAND`` for the SAM transform). Progress
is the stack's events as they happen (``describe_stack_events``); at the end the stack's Outputs are
printed: the function URL, or the endpoint name, after ``describe_endpoint`` reports ``InService``.
modal: ``modal deploy adapters/modal/app.py`` with the TESSERA_MODAL_* / TESSERA_MODELS environment.
Needs boto3 (the [sagemaker] extra) and AWS credentials, or the Modal CLI and a Modal token.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, TextIO

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = {
    "lambda": ROOT / "infra" / "lambda" / "template.yaml",
    "sagemaker": ROOT / "infra" / "sagemaker" / "endpoint.yaml",
}
CAPABILITIES = {
    "lambda": ["CAPABILITY_IAM", "CAPABILITY_AUTO_EXPAND"],
    "sagemaker": ["CAPABILITY_IAM"],
}
#: TemplateBody's limit; bigger templates must go through S3 (TemplateURL)
TEMPLATE_BODY_LIMIT = 51_200
DONE_OK = {"CREATE_COMPLETE", "UPDATE_COMPLETE"}
DONE_FAILED = {"CREATE_FAILED", "ROLLBACK_COMPLETE", "ROLLBACK_FAILED", "UPDATE_ROLLBACK_COMPLETE",
               "UPDATE_ROLLBACK_FAILED", "UPDATE_FAILED", "DELETE_COMPLETE", "DELETE_FAILED"}
MODAL_APP = "adapters/modal/app.py"
#: NoEcho template parameters: never printed
SECRET_PARAMETERS = {"ApiKeys"}


class DeployError(RuntimeError):
    pass


def parse_pairs(pairs: list[str], what: str) -> dict[str, str]:
    result = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{what} must be KEY=VALUE, got {pair!r}")
        result[key] = value
    return result


def load_params_file(path: Path) -> dict[str, str]:
    """A CloudFormation CLI parameter file: ``[{"ParameterKey": K, "ParameterValue": V}, ...]``."""
    items = json.loads(Path(path).read_text())
    return {item["ParameterKey"]: str(item["ParameterValue"]) for item in items}


def stack_request(platform: str, stack_name: str, parameters: dict[str, str],
                  template: Path | None = None) -> dict[str, Any]:
    """The keyword arguments shared by ``create_stack`` and ``update_stack``."""
    body = (template or TEMPLATES[platform]).read_text()
    if len(body.encode()) > TEMPLATE_BODY_LIMIT:
        raise DeployError(f"template over {TEMPLATE_BODY_LIMIT} bytes: upload it to S3 and use TemplateURL")
    return {
        "StackName": stack_name,
        "TemplateBody": body,
        "Parameters": [{"ParameterKey": k, "ParameterValue": v} for k, v in sorted(parameters.items())],
        "Capabilities": CAPABILITIES[platform],
        "Tags": [{"Key": "project", "Value": "tessera"}],
    }


def stack_exists(cfn, stack_name: str) -> bool:
    from botocore.exceptions import ClientError

    try:
        stacks = cfn.describe_stacks(StackName=stack_name)["Stacks"]
    except ClientError as exc:
        if "does not exist" in exc.response.get("Error", {}).get("Message", ""):
            return False
        raise
    return bool(stacks) and stacks[0]["StackStatus"] != "DELETE_COMPLETE"


def create_or_update(cfn, request: dict[str, Any], out: TextIO) -> tuple[str | None, set[str]]:
    """Start the change. Returns ("create" | "update" | None when already up to date, the ids of the
    stack's events from before the change, which the progress display skips)."""
    from botocore.exceptions import ClientError

    if not stack_exists(cfn, request["StackName"]):
        cfn.create_stack(**request, OnFailure="ROLLBACK")
        print(f"creating stack {request['StackName']}", file=out)
        return "create", set()
    before = {e["EventId"] for e in cfn.describe_stack_events(StackName=request["StackName"])["StackEvents"]}
    try:
        cfn.update_stack(**request)
    except ClientError as exc:
        if "No updates are to be performed" in exc.response.get("Error", {}).get("Message", ""):
            print(f"stack {request['StackName']} is up to date", file=out)
            return None, before
        raise
    print(f"updating stack {request['StackName']}", file=out)
    return "update", before


def wait_for_stack(cfn, stack_name: str, out: TextIO, *, seen: set[str] | None = None, poll_s: float = 5.0,
                   timeout_s: float = 3600, sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Poll until the stack settles, printing each new event once (oldest first); returns the stack."""
    seen = set(seen or ())
    started = time.monotonic()
    while True:
        events = cfn.describe_stack_events(StackName=stack_name)["StackEvents"]  # newest first
        for event in reversed(events):
            if event["EventId"] in seen:
                continue
            seen.add(event["EventId"])
            reason = f" ({event['ResourceStatusReason']})" if event.get("ResourceStatusReason") else ""
            print(f"  {event['ResourceStatus']:<28} {event['LogicalResourceId']}{reason}", file=out)
        stack = cfn.describe_stacks(StackName=stack_name)["Stacks"][0]
        status = stack["StackStatus"]
        if status in DONE_OK:
            return stack
        if status in DONE_FAILED:
            raise DeployError(f"stack {stack_name}: {status} {stack.get('StackStatusReason', '')}".rstrip())
        if time.monotonic() - started > timeout_s:
            raise DeployError(f"stack {stack_name}: still {status} after {timeout_s:.0f} s")
        sleep(poll_s)


def outputs(stack: dict[str, Any]) -> dict[str, str]:
    return {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}


def wait_for_endpoint(sm, endpoint: str, out: TextIO, *, poll_s: float = 30.0, timeout_s: float = 3600,
                      sleep: Callable[[float], None] = time.sleep) -> None:
    started = time.monotonic()
    last = None
    while True:
        described = sm.describe_endpoint(EndpointName=endpoint)
        status = described["EndpointStatus"]
        if status != last:
            print(f"  endpoint {endpoint}: {status}", file=out)
            last = status
        if status == "InService":
            return
        if status in ("Failed", "OutOfService", "Deleting"):
            raise DeployError(f"endpoint {endpoint}: {status} {described.get('FailureReason', '')}".rstrip())
        if time.monotonic() - started > timeout_s:
            raise DeployError(f"endpoint {endpoint}: still {status} after {timeout_s:.0f} s")
        sleep(poll_s)


def deploy_stack(platform: str, cfn, request: dict[str, Any], out: TextIO, *, sm=None, poll_s: float = 5.0,
                 sleep: Callable[[float], None] = time.sleep) -> dict[str, str]:
    """Create/update the stack, wait, (SageMaker) wait for InService; returns the stack Outputs."""
    name = request["StackName"]
    change, before = create_or_update(cfn, request, out)
    stack = (wait_for_stack(cfn, name, out, seen=before, poll_s=poll_s, sleep=sleep) if change
             else cfn.describe_stacks(StackName=name)["Stacks"][0])
    result = outputs(stack)
    if platform == "sagemaker":
        wait_for_endpoint(sm, result["EndpointName"], out, poll_s=poll_s * 6, sleep=sleep)
    return result


def show_call(out: TextIO, service: str, operation: str, params: dict[str, Any]) -> None:
    shown = dict(params)
    if "TemplateBody" in shown:
        shown["TemplateBody"] = f"<{len(shown['TemplateBody'])} characters of the template>"
    if "Parameters" in shown:
        shown["Parameters"] = [{**p, "ParameterValue": "****"} if p["ParameterKey"] in SECRET_PARAMETERS else p
                               for p in shown["Parameters"]]
    print(f"{service}.{operation}({json.dumps(shown, sort_keys=True)})", file=out)


def dry_run_stack(platform: str, request: dict[str, Any], out: TextIO) -> None:
    """Print the calls deploy_stack makes, in order, without a client."""
    name = {"StackName": request["StackName"]}
    show_call(out, "cloudformation", "describe_stacks", name)
    show_call(out, "cloudformation", "create_stack", {**request, "OnFailure": "ROLLBACK"})
    print("  (when the stack exists: describe_stack_events, then update_stack with the same arguments "
          "without OnFailure)", file=out)
    show_call(out, "cloudformation", "describe_stack_events", name)
    show_call(out, "cloudformation", "describe_stacks", name)
    print("  (both repeated until the stack is *_COMPLETE; then its Outputs are printed)", file=out)
    if platform == "sagemaker":
        show_call(out, "sagemaker", "describe_endpoint", {"EndpointName": "<Outputs.EndpointName>"})
        print("  (repeated until EndpointStatus is InService)", file=out)


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines; blank lines and ``#`` comments skipped; values taken literally (no quotes)."""
    values = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{path}:{number}: expected KEY=VALUE")
        values[key.strip()] = value.strip()
    return values


def modal_command(env_pairs: dict[str, str], environ: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    env = {**environ, **env_pairs}
    return ["modal", "deploy", MODAL_APP], env


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="platform", required=True)
    for platform in ("lambda", "sagemaker"):
        p = sub.add_parser(platform)
        p.add_argument("--stack-name", default="tessera" if platform == "lambda" else "tessera-sm")
        p.add_argument("--region")
        p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                       help="a template parameter (repeatable; wins over --params-file)")
        p.add_argument("--params-file", type=Path,
                       default=ROOT / "infra/sagemaker/params-cuda.json" if platform == "sagemaker" else None)
        p.add_argument("--template", type=Path, help="another template than infra/'s")
        p.add_argument("--poll", type=float, default=5.0, help="seconds between progress polls")
        p.add_argument("--dry-run", action="store_true")
    sub.choices["lambda"].add_argument("--image-uri", help="ECR image (the ImageUri parameter)")
    sub.choices["sagemaker"].add_argument("--bucket", help="model bucket (the ModelBucket parameter)")
    m = sub.add_parser("modal")
    m.add_argument("--env-file", type=Path, help="KEY=VALUE lines, e.g. infra/modal/tessera.env.example")
    m.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="TESSERA_MODAL_* / TESSERA_MODELS for this deploy (see docs/deploy.md)")
    m.add_argument("--dry-run", action="store_true")
    return parser


def main(argv: list[str] | None = None, out: TextIO = sys.stdout, *, clients=None,
         sleep: Callable[[float], None] = time.sleep, environ: dict[str, str] | None = None) -> int:
    """``clients``: a (cloudformation, sagemaker) pair to use instead of boto3's (the tests' stubs)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    environ = dict(os.environ if environ is None else environ)
    aws_errors: tuple[type[Exception], ...] = ()
    if args.platform != "modal" and not args.dry_run:
        from botocore.exceptions import BotoCoreError, ClientError

        aws_errors = (BotoCoreError, ClientError)
    try:
        if args.platform == "modal":
            pairs = read_env_file(args.env_file) if args.env_file else {}
            pairs.update(parse_pairs(args.env, "--env"))
            command, env = modal_command(pairs, environ)
            shown = " ".join(f"{k}={'****' if k == 'TESSERA_API_KEYS' else repr(v)}"
                             for k, v in sorted(env.items()) if k.startswith("TESSERA_"))
            print(f"{shown} {' '.join(command)}".strip(), file=out)
            if args.dry_run:
                return 0
            if shutil.which("modal", path=env.get("PATH")) is None:
                raise DeployError("the modal CLI is not on PATH: pip install 'tessera[modal]', then modal token new")
            return subprocess.run(command, env=env, cwd=ROOT, check=False).returncode

        params = load_params_file(args.params_file) if args.params_file else {}
        if args.platform == "lambda" and args.image_uri:
            params["ImageUri"] = args.image_uri
        if args.platform == "sagemaker" and args.bucket:
            params["ModelBucket"] = args.bucket
        params.update(parse_pairs(args.param, "--param"))
        required = {"lambda": "ImageUri", "sagemaker": "ModelBucket"}[args.platform]
        if not params.get(required):
            parser.error(f"{required} is required (--{'image-uri' if required == 'ImageUri' else 'bucket'} "
                         f"or --param {required}=...)")
        request = stack_request(args.platform, args.stack_name, params, args.template)
        if args.dry_run:
            dry_run_stack(args.platform, request, out)
            return 0
        if clients is None:
            import boto3  # the [sagemaker] extra

            session = boto3.session.Session(region_name=args.region)
            clients = (session.client("cloudformation"), session.client("sagemaker"))
        cfn, sm = clients
        result = deploy_stack(args.platform, cfn, request, out, sm=sm, poll_s=args.poll, sleep=sleep)
    except (DeployError, ValueError, *aws_errors) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for key, value in result.items():
        print(f"{key}: {value}", file=out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
