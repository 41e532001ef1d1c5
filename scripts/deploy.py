#!/usr/bin/env python
"""Create or update a Tessera deployment and wait until it serves.

    python scripts/deploy.py lambda    --image-uri URI [--stack-name tessera] [--param Key=Value ...]
    python scripts/deploy.py lambda    --param PackageType=Zip --param ZipBucket=B --param ZipKey=K [...]
    python scripts/deploy.py sagemaker --bucket BUCKET [--params-file infra/sagemaker/params-cuda.json]
                                       [--stack-name tessera-sm] [--param Key=Value ...]
    python scripts/deploy.py modal     [--env-file infra/modal/tessera.env] [--env TESSERA_MODAL_GPU=L4 ...]
                                       [--seed] [--allow-public]
    python scripts/deploy.py transform --input s3://BUCKET/docs/ --output s3://BUCKET/embeddings/
                                       (--model-name NAME | --stack-name tessera-sm) [--instance-type ml.g6.xlarge]
                                       [--instance-count 2] [--route embeddings] [--join-input]
    ... --dry-run     check the parameters, then print every AWS call (and the modal command) instead of
                      making it; no credentials needed

lambda / sagemaker: one CloudFormation stack from infra/ (``create_stack`` when it does not exist, else
``update_stack``; a stack left in ``ROLLBACK_COMPLETE`` by a failed first create cannot be updated: it
is deleted, after saying so, and created again), with ``CAPABILITY_IAM`` (+ ``CAPABILITY_AUTO_EXPAND`` for the SAM transform). Progress
is the stack's events as they happen (``describe_stack_events``); at the end the stack's Outputs are
printed: the function URL, or the endpoint name, after ``describe_endpoint`` reports ``InService``.
Before any call (and in a dry run) the parameters are checked against the template: unknown names,
missing required ones, ``AllowedValues``, ``AllowedPattern``, ``MinValue``/``MaxValue``,
``MinLength``/``MaxLength``, the template's ``Rules``, and placeholder secrets (``change-me``).
modal: ``modal deploy adapters/modal/app.py`` with the TESSERA_MODAL_* / TESSERA_MODELS environment, after
checking (``modal volume ls``) that every model served from the Volume is on it (``--seed`` runs
``seed_volume`` for those it can put there; otherwise the deploy stops with the command to run), and refusing
a public endpoint with neither a Modal Secret (API keys) nor proxy auth unless ``--allow-public`` is given.
transform: a SageMaker Batch Transform job over every object under the input prefix (JSON Lines, one
request body per line, e.g. ``{"input": "a document"}``), ``SplitType=Line``, ``BatchStrategy=MultiRecord``,
``AssembleWith=Line``: ``s3://.../out/<object>.out`` holds one answer line per input line, in order.
Needs boto3 (the [sagemaker] extra) and AWS credentials, or the Modal CLI and a Modal token.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
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
#: the app's deploy-time settings and key check (a file beside the app: adapters/ is not an installed package)
MODAL_SETTINGS = ROOT / "adapters" / "modal" / "settings.py"
#: NoEcho template parameters: never printed
SECRET_PARAMETERS = {"ApiKeys"}
#: values that only stand in for a secret (the example files' ``change-me``)
PLACEHOLDER_SECRET = re.compile(r"change[-_ ]?me|replace[-_ ]?me|your[-_ ]?(api[-_ ]?)?key|<[^>]*>|x{4,}", re.I)
TRANSFORM_DONE = {"Completed"}
#: Batch Transform hosts run NVIDIA driver 470 by default (AWS, "Best practices to minimize interruptions during
#: GPU driver upgrades"), which cannot run the CUDA image's CUDA 13 build; 535 runs it through the forward-
#: compatibility libraries the image carries (botocore's TransformResources.TransformAmiVersion documentation
#: lists al2-ami-sagemaker-batch-gpu-470 and -535; core/cuda_driver.py has the branch rules)
TRANSFORM_GPU_AMI = "al2-ami-sagemaker-batch-gpu-535"
TRANSFORM_FAILED = {"Failed", "Stopped"}
JSONLINES = "application/jsonlines"


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


# --- parameters checked against the template ----------------------------------------------------------

class _TemplateLoader(__import__("yaml").SafeLoader):
    """YAML with CloudFormation's short tags: ``!Ref X`` → {"Ref": X}, ``!Equals [...]`` → {"Fn::Equals": [...]}."""


def _tag(loader, suffix, node):
    import yaml

    value = (loader.construct_scalar(node) if isinstance(node, yaml.ScalarNode)
             else loader.construct_sequence(node, deep=True) if isinstance(node, yaml.SequenceNode)
             else loader.construct_mapping(node, deep=True))
    if suffix == "Ref":
        return {"Ref": value}
    if suffix == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)
    return {f"Fn::{suffix}": value}


_TemplateLoader.add_multi_constructor("!", _tag)


def load_template(path: Path) -> dict[str, Any]:
    import yaml

    return yaml.load(Path(path).read_text(), Loader=_TemplateLoader)  # noqa: S506 - SafeLoader subclass


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _evaluate(expr: Any, values: dict[str, str]) -> Any:
    """The condition functions a ``Rules`` section may use, over the parameter values."""
    if isinstance(expr, dict) and len(expr) == 1:
        (key, arg), = expr.items()
        if key == "Ref":
            return values.get(arg, "")
        if key == "Fn::Equals":
            left, right = (_evaluate(a, values) for a in arg)
            return str(left) == str(right)
        if key == "Fn::Not":
            return not _evaluate(arg[0], values)
        if key == "Fn::And":
            return all(_evaluate(a, values) for a in arg)
        if key == "Fn::Or":
            return any(_evaluate(a, values) for a in arg)
        if key == "Fn::Contains":
            items, wanted = arg
            return str(_evaluate(wanted, values)) in [str(_evaluate(i, values)) for i in items]
        raise DeployError(f"the template's Rules use {key}, which this check does not evaluate")
    return expr


def check_parameters(template: dict[str, Any], params: dict[str, str]) -> list[str]:
    """What CloudFormation would refuse about ``params`` (plus placeholder secrets), one line each."""
    declared: dict[str, dict[str, Any]] = template.get("Parameters") or {}
    problems = [f"{key}: not a parameter of this template (it has: {', '.join(sorted(declared))})"
                for key in sorted(set(params) - set(declared))]
    values: dict[str, str] = {}
    for key, spec in declared.items():
        if key not in params and "Default" not in spec:
            problems.append(f"{key}: required (no default)")
            continue
        value = str(params.get(key, spec.get("Default", "")))
        values[key] = value
        if key not in params:
            continue  # defaults are the template's own business
        if spec.get("Type") == "Number":
            number = _number(value)
            if number is None:
                problems.append(f"{key}={value!r}: not a number")
                continue
            if "MinValue" in spec and number < float(spec["MinValue"]):
                problems.append(f"{key}={value}: below MinValue {spec['MinValue']}")
            if "MaxValue" in spec and number > float(spec["MaxValue"]):
                problems.append(f"{key}={value}: above MaxValue {spec['MaxValue']}")
        if "AllowedValues" in spec:
            allowed = [str(v) for v in spec["AllowedValues"]]
            same = (lambda a, b: _number(a) == _number(b)) if spec.get("Type") == "Number" else str.__eq__
            if not any(same(value, a) for a in allowed):
                problems.append(f"{key}={value!r}: not one of {allowed}")
        if "AllowedPattern" in spec and not re.fullmatch(spec["AllowedPattern"], value):
            problems.append(f"{key}={value!r}: does not match {spec['AllowedPattern']}")
        if "MinLength" in spec and len(value) < int(spec["MinLength"]):
            problems.append(f"{key}: shorter than MinLength {spec['MinLength']}")
        if "MaxLength" in spec and len(value) > int(spec["MaxLength"]):
            problems.append(f"{key}: longer than MaxLength {spec['MaxLength']}")
        if (spec.get("NoEcho") or key in SECRET_PARAMETERS) and PLACEHOLDER_SECRET.search(value):
            problems.append(f"{key}: holds a placeholder ({PLACEHOLDER_SECRET.search(value).group(0)!r}), "
                            "not a secret: generate real keys, e.g. python -c 'import secrets; "
                            "print(secrets.token_urlsafe(32))'")
    if problems:
        return problems  # rules over invalid values would only repeat them
    for name, rule in (template.get("Rules") or {}).items():
        if "RuleCondition" in rule and not _evaluate(rule["RuleCondition"], values):
            continue
        for assertion in rule.get("Assertions", []):
            if not _evaluate(assertion["Assert"], values):
                problems.append(f"rule {name}: {assertion.get('AssertDescription', 'assertion failed').strip()}")
    return problems


def check_placeholder_env(env: dict[str, str]) -> list[str]:
    return [f"{key}: holds a placeholder ({PLACEHOLDER_SECRET.search(value).group(0)!r}), not a secret"
            for key, value in sorted(env.items())
            if key in ("TESSERA_API_KEYS",) and PLACEHOLDER_SECRET.search(value)]


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


def stack_status(cfn, stack_name: str) -> str | None:
    """The stack's status; None when there is none (never created, or deleted)."""
    from botocore.exceptions import ClientError

    try:
        stacks = cfn.describe_stacks(StackName=stack_name)["Stacks"]
    except ClientError as exc:
        if "does not exist" in exc.response.get("Error", {}).get("Message", ""):
            return None
        raise
    status = stacks[0]["StackStatus"] if stacks else None
    return None if status == "DELETE_COMPLETE" else status


def stack_exists(cfn, stack_name: str) -> bool:
    return stack_status(cfn, stack_name) is not None


def delete_failed_stack(cfn, stack_name: str, out: TextIO, *, poll_s: float = 5.0, timeout_s: float = 1800,
                        sleep: Callable[[float], None] = time.sleep) -> None:
    """A stack in ROLLBACK_COMPLETE (its first create failed and was rolled back) can only be deleted."""
    print(f"stack {stack_name} is in ROLLBACK_COMPLETE (its first create failed and was rolled back; "
          "CloudFormation cannot update it): deleting it, then creating it again", file=out)
    cfn.delete_stack(StackName=stack_name)
    started = time.monotonic()
    while True:
        status = stack_status(cfn, stack_name)
        if status is None:
            print(f"  deleted {stack_name}", file=out)
            return
        if status == "DELETE_FAILED":
            raise DeployError(f"stack {stack_name}: DELETE_FAILED; delete it in the console, then deploy again")
        if time.monotonic() - started > timeout_s:
            raise DeployError(f"stack {stack_name}: still {status} after {timeout_s:.0f} s")
        sleep(poll_s)


def create_or_update(cfn, request: dict[str, Any], out: TextIO, *, poll_s: float = 5.0,
                     sleep: Callable[[float], None] = time.sleep) -> tuple[str | None, set[str]]:
    """Start the change. Returns ("create" | "update" | None when already up to date, the ids of the
    stack's events from before the change, which the progress display skips)."""
    from botocore.exceptions import ClientError

    status = stack_status(cfn, request["StackName"])
    if status == "ROLLBACK_COMPLETE":
        delete_failed_stack(cfn, request["StackName"], out, poll_s=poll_s, sleep=sleep)
        status = None
    if status is None:
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


def wait_for_endpoint(session, endpoint: str, out: TextIO, *, poll_s: float = 30.0, timeout_s: float = 3600,
                      sleep: Callable[[float], None] = time.sleep) -> None:
    """Poll the endpoint through the SageMaker Python SDK v3 resource (``sagemaker.core.resources.Endpoint``:
    ``get``, then ``refresh``, each a DescribeEndpoint) until it is InService, printing each new status."""
    from sagemaker.core.resources import Endpoint

    resource = Endpoint.get(endpoint_name=endpoint, session=session, region=session.region_name)
    poll_resource(resource, f"endpoint {endpoint}", lambda r: r.endpoint_status, out, done=("InService",),
                  failed=("Failed", "OutOfService", "Deleting"), poll_s=poll_s, timeout_s=timeout_s, sleep=sleep)


def poll_resource(resource, what: str, status_of: Callable[[Any], object], out: TextIO, *, done, failed,
                  poll_s: float, timeout_s: float, sleep: Callable[[float], None]) -> None:
    """Until ``status_of(resource)`` is in ``done`` (return) or ``failed`` (DeployError with the resource's
    failure reason): print each new status once, sleep ``poll_s``, ``resource.refresh()``; DeployError after
    ``timeout_s``."""
    started = time.monotonic()
    last = None
    while True:
        status = str(status_of(resource))
        if status != last:
            print(f"  {what}: {status}", file=out)
            last = status
        if status in done:
            return
        if status in failed:
            reason = resource.failure_reason if isinstance(resource.failure_reason, str) else ""
            raise DeployError(f"{what}: {status} {reason}".rstrip())
        if time.monotonic() - started > timeout_s:
            raise DeployError(f"{what}: still {status} after {timeout_s:.0f} s")
        sleep(poll_s)
        resource.refresh()


def deploy_stack(platform: str, cfn, request: dict[str, Any], out: TextIO, *, session=None, poll_s: float = 5.0,
                 sleep: Callable[[float], None] = time.sleep) -> dict[str, str]:
    """Create/update the stack, wait, (SageMaker) wait for InService; returns the stack Outputs."""
    name = request["StackName"]
    change, before = create_or_update(cfn, request, out, poll_s=poll_s, sleep=sleep)
    stack = (wait_for_stack(cfn, name, out, seen=before, poll_s=poll_s, sleep=sleep) if change
             else cfn.describe_stacks(StackName=name)["Stacks"][0])
    result = outputs(stack)
    if platform == "sagemaker":
        wait_for_endpoint(session, result["EndpointName"], out, poll_s=poll_s * 6, sleep=sleep)
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
          "without OnFailure; when it is in ROLLBACK_COMPLETE: delete_stack and describe_stacks until it is "
          "gone, then create_stack)", file=out)
    show_call(out, "cloudformation", "describe_stack_events", name)
    show_call(out, "cloudformation", "describe_stacks", name)
    print("  (both repeated until the stack is *_COMPLETE; then its Outputs are printed)", file=out)
    if platform == "sagemaker":
        show_call(out, "sagemaker", "describe_endpoint", {"EndpointName": "<Outputs.EndpointName>"})
        print("  (repeated until EndpointStatus is InService)", file=out)


# --- Batch Transform ------------------------------------------------------------------------------------

def split_s3_prefix(url: str, what: str) -> str:
    """``s3://bucket/prefix/`` (checked; the trailing ``/`` added) for a job's input or output."""
    match = re.fullmatch(r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/.*)?", url or "")
    if not match:
        raise ValueError(f"{what} must be an s3://BUCKET/PREFIX/ URL, got {url!r}")
    return url if url.endswith("/") else url + "/"


def transform_request(job_name: str, model_name: str, input_uri: str, output_uri: str, *,
                      instance_type: str = "ml.g6.xlarge", instance_count: int = 1, max_payload_mb: int = 6,
                      concurrency: int = 2, route: str | None = None, join_input: bool = False,
                      timeout_s: int = 600, ami_version: str | None = None) -> dict[str, Any]:
    """``create_transform_job`` arguments: every JSON Lines object under ``input_uri``, split per line, sent
    as MultiRecord mini-batches of at most ``max_payload_mb``; answers assembled per line under ``output_uri``."""
    if not re.fullmatch(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}", job_name):
        raise ValueError(f"job name {job_name!r}: letters, digits and '-', at most 63 characters")
    if not re.fullmatch(r"ml\.[a-z0-9]+\.[a-z0-9]+", instance_type):
        raise ValueError(f"instance type {instance_type!r}: expected e.g. ml.g6.xlarge")
    if not 1 <= max_payload_mb <= 100:  # the container raises its body limit to SAGEMAKER_MAX_PAYLOAD_IN_MB
        raise ValueError("--max-payload-mb must be 1..100 (Batch Transform's MaxPayloadInMB limit)")
    if instance_count < 1 or concurrency < 1:
        raise ValueError("--instance-count and --concurrency must be at least 1")
    environment = {"TESSERA_SAGEMAKER_MAX_RESPONSE_BYTES": "0",  # no 6 MB response limit in Batch Transform
                   # the container's deadline (its 504s) inside the job's invocation timeout
                   "TESSERA_REQUEST_TIMEOUT_S": str(max(1, timeout_s - 5))}
    if route:
        environment["TESSERA_SAGEMAKER_ROUTE"] = route
    request: dict[str, Any] = {
        "TransformJobName": job_name,
        "ModelName": model_name,
        "MaxConcurrentTransforms": concurrency,
        "MaxPayloadInMB": max_payload_mb,
        "BatchStrategy": "MultiRecord",
        "ModelClientConfig": {"InvocationsTimeoutInSeconds": timeout_s, "InvocationsMaxRetries": 1},
        "Environment": environment,
        "TransformInput": {
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix",
                                            "S3Uri": split_s3_prefix(input_uri, "--input")}},
            "ContentType": JSONLINES, "CompressionType": "None", "SplitType": "Line",
        },
        "TransformOutput": {"S3OutputPath": split_s3_prefix(output_uri, "--output"), "Accept": JSONLINES,
                            "AssembleWith": "Line"},
        "TransformResources": {"InstanceType": instance_type, "InstanceCount": instance_count},
        "Tags": [{"Key": "project", "Value": "tessera"}],
    }
    if ami_version is None and instance_type.split(".")[1][:1] in ("g", "p"):  # an NVIDIA GPU host
        ami_version = TRANSFORM_GPU_AMI
    if ami_version:
        request["TransformResources"]["TransformAmiVersion"] = ami_version
    if join_input:
        request["DataProcessing"] = {"JoinSource": "Input"}  # each input record + its "SageMakerOutput"
    return request


def model_from_stack(cfn, stack_name: str) -> str:
    stacks = cfn.describe_stacks(StackName=stack_name)["Stacks"]
    name = outputs(stacks[0]).get("ModelName") if stacks else None
    if not name:
        raise DeployError(f"stack {stack_name} has no ModelName output: deploy infra/sagemaker/endpoint.yaml "
                          "first (scripts/deploy.py sagemaker), or pass --model-name")
    return name


def create_transform_job(request: dict[str, Any], session):
    """``request`` (create_transform_job's arguments) through the SageMaker Python SDK v3 resource
    ``sagemaker.core.resources.TransformJob`` (sagemaker-core), on the boto3 ``session``: it creates the
    job and describes it once."""
    from sagemaker.core import shapes
    from sagemaker.core.resources import TransformJob

    source, target = request["TransformInput"], request["TransformOutput"]
    s3 = source["DataSource"]["S3DataSource"]
    options: dict[str, Any] = {}
    if "DataProcessing" in request:
        options["data_processing"] = shapes.DataProcessing(join_source=request["DataProcessing"]["JoinSource"])
    return TransformJob.create(
        transform_job_name=request["TransformJobName"],
        model_name=request["ModelName"],
        transform_input=shapes.TransformInput(
            data_source=shapes.TransformDataSource(s3_data_source=shapes.TransformS3DataSource(
                s3_data_type=s3["S3DataType"], s3_uri=s3["S3Uri"])),
            content_type=source["ContentType"], compression_type=source["CompressionType"],
            split_type=source["SplitType"]),
        transform_output=shapes.TransformOutput(s3_output_path=target["S3OutputPath"], accept=target["Accept"],
                                                assemble_with=target["AssembleWith"]),
        transform_resources=shapes.TransformResources(
            instance_type=request["TransformResources"]["InstanceType"],
            instance_count=request["TransformResources"]["InstanceCount"],
            transform_ami_version=request["TransformResources"].get("TransformAmiVersion")),
        max_concurrent_transforms=request["MaxConcurrentTransforms"],
        max_payload_in_mb=request["MaxPayloadInMB"],
        batch_strategy=request["BatchStrategy"],
        model_client_config=shapes.ModelClientConfig(
            invocations_timeout_in_seconds=request["ModelClientConfig"]["InvocationsTimeoutInSeconds"],
            invocations_max_retries=request["ModelClientConfig"]["InvocationsMaxRetries"]),
        environment=request["Environment"],
        tags=[{"key": t["Key"], "value": t["Value"]} for t in request["Tags"]],
        session=session, region=session.region_name, **options,
    )


def wait_for_transform(job, out: TextIO, *, poll_s: float = 30.0, timeout_s: float = 2 * 86400,
                       sleep: Callable[[float], None] = time.sleep) -> None:
    """Poll the SDK resource (``refresh`` = describe_transform_job) until the job ends, printing each new
    status once (the SDK's own ``wait`` draws a live panel instead, and sleeps on its own clock)."""
    poll_resource(job, f"transform job {job.transform_job_name}", lambda j: j.transform_job_status, out,
                  done=TRANSFORM_DONE, failed=TRANSFORM_FAILED, poll_s=poll_s, timeout_s=timeout_s, sleep=sleep)


def run_transform(session, cfn, request: dict[str, Any], out: TextIO, *, stack_name: str | None,
                  wait: bool = True, poll_s: float = 30.0,
                  sleep: Callable[[float], None] = time.sleep) -> dict[str, str]:
    if not request["ModelName"]:
        request = {**request, "ModelName": model_from_stack(cfn, stack_name)}
    job = create_transform_job(request, session)
    print(f"started transform job {request['TransformJobName']} on model {request['ModelName']}", file=out)
    result = {"TransformJobArn": str(job.transform_job_arn), "Output": request["TransformOutput"]["S3OutputPath"]}
    if wait:
        wait_for_transform(job, out, poll_s=poll_s, sleep=sleep)
    return result


def dry_run_transform(request: dict[str, Any], out: TextIO, stack_name: str | None) -> None:
    if not request["ModelName"]:
        show_call(out, "cloudformation", "describe_stacks", {"StackName": stack_name})
        request = {**request, "ModelName": "<Outputs.ModelName>"}
    show_call(out, "sagemaker", "create_transform_job", request)
    show_call(out, "sagemaker", "describe_transform_job", {"TransformJobName": request["TransformJobName"]})
    print("  (repeated until TransformJobStatus is Completed; output: one <object>.out per input object)", file=out)


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


def _modal_settings_module():
    """adapters/modal/settings.py, by path (adapters/ is not an installed package)."""
    spec = importlib.util.spec_from_file_location("tessera_modal_settings", MODAL_SETTINGS)
    settings = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = settings  # its dataclass looks its module up there
    spec.loader.exec_module(settings)
    return settings


def modal_keys_problem(env: dict[str, str]) -> str | None:
    """The refusal ``modal deploy`` of the app applies to ``env`` (keys without a named Modal Secret), or None."""
    return _modal_settings_module().deploy_time_keys_problem(env)


def volume_ls_command(volume: str, path: str) -> list[str]:
    return ["modal", "volume", "ls", volume, path, "--json"]


def seed_command(args: list[str]) -> list[str]:
    return ["modal", "run", f"{MODAL_APP}::seed_volume", *args]


def volume_has(volume: str, folder: str, entry: str, env: dict[str, str]) -> bool:
    """Whether ``folder`` on the Volume holds ``entry`` (any entry when ""): ``modal volume ls --json`` lists
    it (it fails on a missing folder or Volume)."""
    done = subprocess.run(volume_ls_command(volume, folder), env=env, cwd=ROOT, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        return False
    try:
        listed = [str(row.get("filename", "")) for row in json.loads(done.stdout or "[]")]
    except (ValueError, AttributeError):
        return False
    return bool(listed) and (not entry or any(name.rsplit("/", 1)[-1] == entry for name in listed))


def seed_modal_volume(settings, env: dict[str, str], out: TextIO, *, seed: bool) -> None:
    """Every model served from the Volume is there before ``modal deploy``, or the deploy stops: a container
    cannot start without its model, and Modal would retry the start, billed, until the Volume is seeded.
    ``seed``: run ``seed_volume`` for the models it can put there (the embedded default, Hub ids) first."""
    missing = []
    for spec_path, folder, entry, seed_args in settings.volume_models():
        if volume_has(settings.volume_name, folder, entry, env):
            continue
        if seed and seed_args is not None:
            command = seed_command(seed_args)
            print(f"seeding {spec_path}: {' '.join(command)}", file=out)
            if subprocess.run(command, env=env, cwd=ROOT, check=False).returncode != 0:
                raise DeployError(f"{' '.join(command)} failed")
            if volume_has(settings.volume_name, folder, entry, env):
                continue
        how = (f"python scripts/deploy.py modal --seed (runs {' '.join(seed_command(seed_args))})" if seed_args is not None
               else f"modal volume put {settings.volume_name} ./<model folder> /{folder}")
        wanted = f"{folder}/{entry}" if entry else folder
        missing.append(f"{spec_path} is not on the Volume {settings.volume_name!r} ({wanted} not found): {how}")
    if missing:
        raise DeployError("the containers would fail to start until the Volume holds their models:\n  "
                          + "\n  ".join(missing))


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
    m.add_argument("--seed", action="store_true",
                   help="put missing models on the Volume first (seed_volume: the embedded default, Hub ids)")
    m.add_argument("--allow-public", action="store_true",
                   help="deploy with neither a Modal Secret (API keys) nor proxy auth: a public, open endpoint")
    m.add_argument("--dry-run", action="store_true")
    t = sub.add_parser("transform", help="a SageMaker Batch Transform job: S3 prefix of JSON Lines in, answers out")
    t.add_argument("--input", required=True, help="s3://BUCKET/PREFIX/ of JSON Lines objects, one request per line")
    t.add_argument("--output", required=True, help="s3://BUCKET/PREFIX/ for the answers (<object>.out)")
    who = t.add_mutually_exclusive_group()
    who.add_argument("--model-name", help="a SageMaker model (default: the stack's ModelName output)")
    who.add_argument("--stack-name", default="tessera-sm", help="the sagemaker stack whose model to use")
    t.add_argument("--job-name", default=None, help="default: tessera-YYYYmmdd-HHMMSS")
    t.add_argument("--instance-type", default="ml.g6.xlarge")
    t.add_argument("--instance-count", type=int, default=1)
    t.add_argument("--transform-ami", default=None,
                   help=f"TransformAmiVersion (default on GPU hosts: {TRANSFORM_GPU_AMI}; '' for AWS's own)")
    t.add_argument("--max-payload-mb", type=int, default=6, help="mini-batch size (MaxPayloadInMB), 1..100")
    t.add_argument("--concurrency", type=int, default=2, help="mini-batches in flight per instance")
    t.add_argument("--route", help="route of every record (default: the models' one capability)")
    t.add_argument("--join-input", action="store_true", help="write each input record with its SageMakerOutput")
    t.add_argument("--region")
    t.add_argument("--poll", type=float, default=30.0)
    t.add_argument("--no-wait", action="store_true", help="start the job and return")
    t.add_argument("--dry-run", action="store_true")
    return parser


def main(argv: list[str] | None = None, out: TextIO = sys.stdout, *, clients=None, session=None,
         sleep: Callable[[float], None] = time.sleep, environ: dict[str, str] | None = None) -> int:
    """``clients``: a (cloudformation, unused) pair to use instead of boto3's (the tests' stubs);
    ``session``: the boto3 session the SageMaker SDK resources use (endpoint wait, transform job)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    environ = dict(os.environ if environ is None else environ)
    aws_errors: tuple[type[Exception], ...] = (OSError,)
    if args.platform != "modal" and not args.dry_run:
        from botocore.exceptions import BotoCoreError, ClientError

        aws_errors = (OSError, BotoCoreError, ClientError)
        if args.platform == "transform":
            from pydantic import ValidationError  # the SDK's shapes refuse bad values before any call

            aws_errors += (ValidationError,)
    try:
        if args.platform == "modal":
            if args.env_file and not args.env_file.is_file():
                raise DeployError(f"--env-file {args.env_file}: no such file (copy infra/modal/tessera.env.example "
                                  "to infra/modal/tessera.env and edit it)")
            pairs = read_env_file(args.env_file) if args.env_file else {}
            pairs.update(parse_pairs(args.env, "--env"))
            command, env = modal_command(pairs, environ)
            problems = check_placeholder_env(pairs)
            if problems:
                raise DeployError("; ".join(problems) + " (set real keys, or leave TESSERA_API_KEYS out)")
            problem = modal_keys_problem(env)  # as adapters/modal/app.py refuses them
            if problem:
                raise DeployError(problem)
            module = _modal_settings_module()
            settings = module.modal_settings(env)
            problem = module.public_endpoint_problem(settings)
            if problem and not args.allow_public:
                raise DeployError(problem)
            shown = " ".join(f"{k}={'****' if k == 'TESSERA_API_KEYS' else repr(v)}"
                             for k, v in sorted(env.items()) if k.startswith("TESSERA_"))
            if args.dry_run:
                for spec_path, folder, entry, seed_args in settings.volume_models():
                    fix = ("with --seed: " + " ".join(seed_command(seed_args)) if seed_args is not None
                           else "else refused: modal volume put")
                    print(f"{' '.join(volume_ls_command(settings.volume_name, folder))}   "
                          f"# {spec_path}: {entry or 'a snapshot'} there? ({fix})", file=out)
                print(f"{shown} {' '.join(command)}".strip(), file=out)
                return 0
            if shutil.which("modal", path=env.get("PATH")) is None:
                raise DeployError("the modal CLI is not on PATH: pip install -e '.[modal]', then modal token new")
            seed_modal_volume(settings, env, out, seed=args.seed)
            print(f"{shown} {' '.join(command)}".strip(), file=out)
            return subprocess.run(command, env=env, cwd=ROOT, check=False).returncode

        if args.platform == "transform":
            job_name = args.job_name or time.strftime("tessera-%Y%m%d-%H%M%S", time.gmtime())
            request = transform_request(job_name, args.model_name or "", args.input, args.output,
                                        instance_type=args.instance_type, instance_count=args.instance_count,
                                        max_payload_mb=args.max_payload_mb, concurrency=args.concurrency,
                                        route=args.route, join_input=args.join_input, ami_version=args.transform_ami)
            stack_name = None if args.model_name else args.stack_name
            if args.dry_run:
                dry_run_transform(request, out, stack_name)
                return 0
            if session is None:
                import boto3  # the [sagemaker] extra

                session = boto3.session.Session(region_name=args.region)
            cfn = clients[0] if clients else session.client("cloudformation")
            result = run_transform(session, cfn, request, out, stack_name=stack_name, wait=not args.no_wait,
                                   poll_s=args.poll, sleep=sleep)
            for key, value in result.items():
                print(f"{key}: {value}", file=out)
            return 0

        if args.params_file and not args.params_file.is_file():
            raise DeployError(f"--params-file {args.params_file}: no such file")
        params = load_params_file(args.params_file) if args.params_file else {}
        if args.platform == "lambda" and args.image_uri:
            params["ImageUri"] = args.image_uri
        if args.platform == "sagemaker" and args.bucket:
            params["ModelBucket"] = args.bucket
        params.update(parse_pairs(args.param, "--param"))
        required = {"lambda": "ImageUri", "sagemaker": "ModelBucket"}[args.platform]
        zipped = args.platform == "lambda" and params.get("PackageType") == "Zip"  # its Rules name what it needs
        if not params.get(required) and not zipped:
            parser.error(f"{required} is required (--{'image-uri' if required == 'ImageUri' else 'bucket'} "
                         f"or --param {required}=...)")
        template_path = args.template or TEMPLATES[args.platform]
        problems = check_parameters(load_template(template_path), params)
        if problems:
            raise DeployError(f"the parameters do not fit {template_path.name}:\n  " + "\n  ".join(problems))
        request = stack_request(args.platform, args.stack_name, params, args.template)
        if args.dry_run:
            dry_run_stack(args.platform, request, out)
            return 0
        if session is None and (clients is None or args.platform == "sagemaker"):
            import boto3  # the [sagemaker] extra

            session = boto3.session.Session(region_name=args.region)
        cfn = clients[0] if clients else session.client("cloudformation")
        result = deploy_stack(args.platform, cfn, request, out, session=session, poll_s=args.poll, sleep=sleep)
    except (DeployError, ValueError, *aws_errors) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for key, value in result.items():
        print(f"{key}: {value}", file=out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
