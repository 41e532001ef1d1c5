"""scripts/deploy.py: the exact CloudFormation / SageMaker calls (botocore Stubber: nothing leaves the
machine), the progress it prints, the dry-run output, and the modal command it runs."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import re
import stat

import pytest
from botocore.stub import Stubber

from tests.support.modules import load_script

from .conftest import LAMBDA_TEMPLATE, ROOT, SAGEMAKER_TEMPLATE

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/tessera-lambda:arm64"
URL = "https://abcdefg.lambda-url.us-east-1.on.aws/"
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


@pytest.fixture(scope="module")
def deploy():
    return load_script("deploy")


@pytest.fixture
def clients(fake_aws):
    import boto3

    session = boto3.session.Session(region_name="us-east-1")
    return session.client("cloudformation"), session.client("sagemaker")


def event(event_id: str, logical: str, status: str, reason: str | None = None) -> dict:
    e = {"StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/s/1", "EventId": event_id,
         "StackName": "s", "LogicalResourceId": logical, "Timestamp": NOW, "ResourceStatus": status}
    if reason:
        e["ResourceStatusReason"] = reason
    return e


def stack(name: str, status: str, outputs: dict[str, str] | None = None, reason: str | None = None) -> dict:
    s = {"StackName": name, "StackId": f"arn:aws:cloudformation:us-east-1:123456789012:stack/{name}/1",
         "CreationTime": NOW, "StackStatus": status,
         "Outputs": [{"OutputKey": k, "OutputValue": v} for k, v in (outputs or {}).items()]}
    if reason:
        s["StackStatusReason"] = reason
    return s


def expected_request(platform: str, name: str, params: dict[str, str]) -> dict:
    template = {"lambda": LAMBDA_TEMPLATE, "sagemaker": SAGEMAKER_TEMPLATE}[platform]
    return {"StackName": name, "TemplateBody": template.read_text(),
            "Parameters": [{"ParameterKey": k, "ParameterValue": v} for k, v in sorted(params.items())],
            "Capabilities": {"lambda": ["CAPABILITY_IAM", "CAPABILITY_AUTO_EXPAND"],
                             "sagemaker": ["CAPABILITY_IAM"]}[platform],
            "Tags": [{"Key": "project", "Value": "tessera"}]}


def missing(stub: Stubber, name: str) -> None:
    stub.add_client_error("describe_stacks", service_error_code="ValidationError",
                          service_message=f"Stack with id {name} does not exist", http_status_code=400,
                          expected_params={"StackName": name})


def test_lambda_create_waits_and_prints_the_url(deploy, clients):
    cfn, sm = clients
    name = {"StackName": "tessera"}
    params = {"ImageUri": IMAGE, "AuthType": "NONE", "ApiKeys": '["k1"]'}
    sleeps = []
    out = io.StringIO()
    with Stubber(cfn) as stub:
        missing(stub, "tessera")
        stub.add_response("create_stack", {"StackId": "id"},
                          {**expected_request("lambda", "tessera", params), "OnFailure": "ROLLBACK"})
        stub.add_response("describe_stack_events", {"StackEvents": [
            event("2", "LogGroup", "CREATE_IN_PROGRESS"), event("1", "tessera", "CREATE_IN_PROGRESS", "User Initiated")]},
            name)
        stub.add_response("describe_stacks", {"Stacks": [stack("tessera", "CREATE_IN_PROGRESS")]}, name)
        stub.add_response("describe_stack_events", {"StackEvents": [
            event("4", "tessera", "CREATE_COMPLETE"), event("3", "FunctionUrl", "CREATE_COMPLETE"),
            event("2", "LogGroup", "CREATE_IN_PROGRESS"), event("1", "tessera", "CREATE_IN_PROGRESS", "User Initiated")]},
            name)
        stub.add_response("describe_stacks", {"Stacks": [
            stack("tessera", "CREATE_COMPLETE", {"FunctionUrl": URL, "AuthType": "NONE"})]}, name)
        code = deploy.main(["lambda", "--image-uri", IMAGE, "--param", "AuthType=NONE", "--param", 'ApiKeys=["k1"]',
                            "--poll", "7"], out=out, clients=(cfn, sm), sleep=sleeps.append)
        stub.assert_no_pending_responses()
    assert code == 0
    assert sleeps == [7.0]
    lines = [line.split() for line in out.getvalue().splitlines()]
    assert lines == [["creating", "stack", "tessera"],
                     ["CREATE_IN_PROGRESS", "tessera", "(User", "Initiated)"],
                     ["CREATE_IN_PROGRESS", "LogGroup"],
                     ["CREATE_COMPLETE", "FunctionUrl"],
                     ["CREATE_COMPLETE", "tessera"],
                     ["FunctionUrl:", URL], ["AuthType:", "NONE"]]


def test_update_skips_old_events_and_up_to_date_is_fine(deploy, clients):
    cfn, sm = clients
    name = {"StackName": "tessera"}
    params = {"ImageUri": IMAGE}
    old = [event("old-2", "tessera", "CREATE_COMPLETE"), event("old-1", "FunctionUrl", "CREATE_COMPLETE")]
    out = io.StringIO()
    with Stubber(cfn) as stub:
        stub.add_response("describe_stacks", {"Stacks": [stack("tessera", "CREATE_COMPLETE")]}, name)
        stub.add_response("describe_stack_events", {"StackEvents": old}, name)
        stub.add_response("update_stack", {"StackId": "id"}, expected_request("lambda", "tessera", params))
        stub.add_response("describe_stack_events", {"StackEvents": [
            event("new-2", "tessera", "UPDATE_COMPLETE"), event("new-1", "TesseraFunction", "UPDATE_COMPLETE"), *old]},
            name)
        stub.add_response("describe_stacks", {"Stacks": [stack("tessera", "UPDATE_COMPLETE", {"FunctionUrl": URL})]},
                          name)
        # second run: nothing changed
        stub.add_response("describe_stacks", {"Stacks": [stack("tessera", "UPDATE_COMPLETE")]}, name)
        stub.add_response("describe_stack_events", {"StackEvents": old}, name)
        stub.add_client_error("update_stack", service_error_code="ValidationError",
                              service_message="No updates are to be performed.",
                              expected_params=expected_request("lambda", "tessera", params))
        stub.add_response("describe_stacks", {"Stacks": [stack("tessera", "UPDATE_COMPLETE", {"FunctionUrl": URL})]},
                          name)
        assert deploy.main(["lambda", "--image-uri", IMAGE], out=out, clients=(cfn, sm), sleep=None) == 0
        assert deploy.main(["lambda", "--image-uri", IMAGE], out=out, clients=(cfn, sm), sleep=None) == 0
        stub.assert_no_pending_responses()
    text = out.getvalue()
    assert "old-" not in text and "CREATE_COMPLETE" not in text
    assert text.splitlines() == ["updating stack tessera", "  UPDATE_COMPLETE              TesseraFunction",
                                 "  UPDATE_COMPLETE              tessera", f"FunctionUrl: {URL}",
                                 "stack tessera is up to date", f"FunctionUrl: {URL}"]


def test_sagemaker_create_waits_for_in_service(deploy, clients, sdk):
    """The endpoint wait runs through the SDK's Endpoint resource (get, then refresh)."""
    cfn, _ = clients
    session, sm = sdk
    name = {"StackName": "tessera-sm"}
    params = {p["ParameterKey"]: p["ParameterValue"]
              for p in json.loads((ROOT / "infra/sagemaker/params-inf2.json").read_text())}
    params.update(ModelBucket="my-models", MaxInstances="8")
    out = io.StringIO()
    sleeps = []
    with Stubber(cfn) as cstub, Stubber(sm) as sstub:
        missing(cstub, "tessera-sm")
        cstub.add_response("create_stack", {"StackId": "id"},
                           {**expected_request("sagemaker", "tessera-sm", params), "OnFailure": "ROLLBACK"})
        cstub.add_response("describe_stack_events", {"StackEvents": [event("1", "Endpoint", "CREATE_COMPLETE")]}, name)
        cstub.add_response("describe_stacks", {"Stacks": [
            stack("tessera-sm", "CREATE_COMPLETE", {"EndpointName": "tessera-sm"})]}, name)
        for status in ("Creating", "Creating", "InService"):
            sstub.add_response("describe_endpoint", {
                "EndpointName": "tessera-sm", "EndpointArn": "arn:aws:sagemaker:us-east-1:123456789012:endpoint/tessera-sm",
                "EndpointConfigName": "c", "EndpointStatus": status, "CreationTime": NOW, "LastModifiedTime": NOW},
                {"EndpointName": "tessera-sm"})
        code = deploy.main(["sagemaker", "--bucket", "my-models", "--params-file",
                            str(ROOT / "infra/sagemaker/params-inf2.json"), "--param", "MaxInstances=8",
                            "--poll", "1"], out=out, clients=(cfn, None), session=session, sleep=sleeps.append)
        cstub.assert_no_pending_responses()
        sstub.assert_no_pending_responses()
    assert code == 0
    assert sleeps == [6.0, 6.0]
    assert out.getvalue().splitlines()[-3:] == ["  endpoint tessera-sm: Creating", "  endpoint tessera-sm: InService",
                                                "EndpointName: tessera-sm"]


def test_failed_stack_exits_1_with_the_reason(deploy, clients, capsys):
    cfn, sm = clients
    name = {"StackName": "tessera"}
    with Stubber(cfn) as stub:
        missing(stub, "tessera")
        stub.add_response("create_stack", {"StackId": "id"},
                          {**expected_request("lambda", "tessera", {"ImageUri": IMAGE}), "OnFailure": "ROLLBACK"})
        stub.add_response("describe_stack_events", {"StackEvents": [
            event("1", "TesseraFunction", "CREATE_FAILED", "Source image does not exist")]}, name)
        stub.add_response("describe_stacks", {"Stacks": [stack("tessera", "ROLLBACK_COMPLETE")]}, name)
        code = deploy.main(["lambda", "--image-uri", IMAGE], out=io.StringIO(), clients=(cfn, sm), sleep=None)
    assert code == 1
    assert capsys.readouterr().err.strip() == "error: stack tessera: ROLLBACK_COMPLETE"


def test_access_denied_is_reported_not_raised(deploy, clients, capsys):
    cfn, sm = clients
    with Stubber(cfn) as stub:
        stub.add_client_error("describe_stacks", service_error_code="AccessDenied",
                              service_message="not authorized to perform: cloudformation:DescribeStacks",
                              http_status_code=403, expected_params={"StackName": "tessera"})
        code = deploy.main(["lambda", "--image-uri", IMAGE], out=io.StringIO(), clients=(cfn, sm))
    assert code == 1
    assert "AccessDenied" in capsys.readouterr().err


def test_dry_run_lists_every_call_without_credentials(deploy, monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    out = io.StringIO()
    assert deploy.main(["lambda", "--image-uri", IMAGE, "--param", "AuthType=NONE",
                        "--param", 'ApiKeys=["secret-key"]', "--dry-run"], out=out) == 0
    text = out.getvalue()
    assert "secret-key" not in text
    calls = [line.split("(", 1)[0] for line in text.splitlines() if not line.startswith("  ")]
    assert calls == ["cloudformation.describe_stacks", "cloudformation.create_stack",
                     "cloudformation.describe_stack_events", "cloudformation.describe_stacks"]
    create = json.loads(text.splitlines()[1].split("(", 1)[1].rstrip(")"))
    assert create["Capabilities"] == ["CAPABILITY_IAM", "CAPABILITY_AUTO_EXPAND"]
    assert create["OnFailure"] == "ROLLBACK"
    assert {"ParameterKey": "ApiKeys", "ParameterValue": "****"} in create["Parameters"]
    assert {"ParameterKey": "ImageUri", "ParameterValue": IMAGE} in create["Parameters"]
    assert create["TemplateBody"] == f"<{len(LAMBDA_TEMPLATE.read_text())} characters of the template>"

    out = io.StringIO()
    assert deploy.main(["sagemaker", "--bucket", "b-1", "--dry-run"], out=out) == 0
    calls = [line.split("(", 1)[0] for line in out.getvalue().splitlines() if not line.startswith("  ")]
    assert calls[-1] == "sagemaker.describe_endpoint"
    create = json.loads(out.getvalue().splitlines()[1].split("(", 1)[1].rstrip(")"))
    assert create["Capabilities"] == ["CAPABILITY_IAM"]
    assert {"ParameterKey": "InstanceType", "ParameterValue": "ml.g6.xlarge"} in create["Parameters"]  # cuda default


def test_required_parameters(deploy, capsys):
    with pytest.raises(SystemExit) as exc:
        deploy.main(["lambda", "--dry-run"], out=io.StringIO())
    assert exc.value.code == 2 and "ImageUri is required" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        deploy.main(["sagemaker", "--dry-run"], out=io.StringIO())
    assert "ModelBucket is required" in capsys.readouterr().err


def test_lambda_zip_package_needs_no_image(deploy, capsys):
    """PackageType Zip: the zip's S3 object instead of an image; the template's rule names what is missing."""
    out = io.StringIO()
    zipped = ["lambda", "--param", "PackageType=Zip", "--param", "ZipBucket=my-code", "--dry-run"]
    assert deploy.main([*zipped, "--param", "ZipKey=tessera-lambda.zip"], out=out) == 0
    create = json.loads(out.getvalue().splitlines()[1].split("(", 1)[1].rstrip(")"))
    assert {"ParameterKey": "PackageType", "ParameterValue": "Zip"} in create["Parameters"]
    assert not [p for p in create["Parameters"] if p["ParameterKey"] == "ImageUri"]
    err = _refused(deploy, zipped, capsys)
    assert "rule ZipNeedsItsObject: PackageType Zip needs ZipBucket and ZipKey" in err


#: a stand-in `modal` executable: records each call (argv, cwd, TESSERA_* environment) and keeps a Volume as a
#: folder: `volume ls VOLUME FOLDER --json` lists it as Modal's CLI does (JSON rows with a "filename"; exit 1 when
#: the folder is missing), `run adapters/modal/app.py::seed_volume` writes the default model's config.json there
FAKE_MODAL = """#!/usr/bin/env python3
import json, os, sys
from pathlib import Path
state = Path({state!r})
calls = json.loads((state / "calls.json").read_text()) if (state / "calls.json").exists() else []
calls.append({{"argv": sys.argv[1:], "cwd": os.getcwd(),
               "env": {{k: v for k, v in os.environ.items() if k.startswith("TESSERA_")}}}})
(state / "calls.json").write_text(json.dumps(calls))
argv = sys.argv[1:]
if argv[:2] == ["volume", "ls"]:
    folder = state / "volume" / argv[2] / argv[3]
    if not folder.is_dir():
        sys.exit("Error: no such file or directory: " + argv[3])
    print(json.dumps([{{"filename": f"{{argv[3]}}/{{p.name}}", "type": "file"}} for p in sorted(folder.iterdir())]))
elif argv[:2] == ["run", "adapters/modal/app.py::seed_volume"]:
    target = state / "volume" / os.environ.get("TESSERA_MODAL_VOLUME", "tessera-models") / "all-MiniLM-L6-v2"
    target.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text("{{}}")
"""


def _fake_modal(tmp_path):
    state = tmp_path / "modal-state"
    state.mkdir()
    fake = tmp_path / "bin" / "modal"
    fake.parent.mkdir()
    fake.write_text(FAKE_MODAL.format(state=str(state)))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    calls = lambda: json.loads((state / "calls.json").read_text())  # noqa: E731
    return fake.parent, state, calls


def test_modal_runs_modal_deploy_with_the_env(deploy, tmp_path):
    bin_dir, state, calls = _fake_modal(tmp_path)
    (state / "volume" / "tessera-models" / "all-MiniLM-L6-v2").mkdir(parents=True)
    (state / "volume" / "tessera-models" / "all-MiniLM-L6-v2" / "config.json").write_text("{}")
    environ = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "TESSERA_MODAL_GPU": "A10G",
               "TESSERA_API_KEYS": '["k"]', "TESSERA_MODAL_SECRET": "tessera-keys"}
    out = io.StringIO()
    code = deploy.main(["modal", "--env", "TESSERA_MODAL_MAX_CONTAINERS=8", "--env", "TESSERA_MODAL_GPU=L4"],
                       out=out, environ=environ)
    assert code == 0
    seen = calls()
    assert [c["argv"] for c in seen] == [["volume", "ls", "tessera-models", "all-MiniLM-L6-v2", "--json"],
                                         ["deploy", "adapters/modal/app.py"]]
    assert seen[-1]["cwd"] == str(ROOT)
    assert seen[-1]["env"] == {"TESSERA_MODAL_GPU": "L4", "TESSERA_MODAL_MAX_CONTAINERS": "8",
                               "TESSERA_API_KEYS": '["k"]', "TESSERA_MODAL_SECRET": "tessera-keys"}
    assert out.getvalue().strip() == ("TESSERA_API_KEYS=**** TESSERA_MODAL_GPU='L4' TESSERA_MODAL_MAX_CONTAINERS='8' "
                                      "TESSERA_MODAL_SECRET='tessera-keys' modal deploy adapters/modal/app.py")


def test_modal_deploy_seeds_the_volume_or_refuses_until_seeded(deploy, tmp_path, capsys):
    """`modal deploy` of an app whose Volume lacks the model succeeds, then every container start fails:
    deploy.py looks first (`modal volume ls`, whose arguments are parsed here by the real modal CLI), and
    stops with the command to run, or with --seed runs seed_volume, checks again and deploys."""
    from modal.cli.entry_point import entrypoint_cli

    bin_dir, state, calls = _fake_modal(tmp_path)
    environ = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "TESSERA_MODAL_SECRET": "tessera-keys"}
    assert deploy.main(["modal"], out=io.StringIO(), environ=environ) == 1
    err = capsys.readouterr().err
    assert "/models/all-MiniLM-L6-v2 is not on the Volume 'tessera-models'" in err and "--seed" in err
    assert [c["argv"][0] for c in calls()] == ["volume"]  # no deploy
    out = io.StringIO()
    assert deploy.main(["modal", "--seed"], out=out, environ=environ) == 0
    assert [c["argv"][:2] for c in calls()[1:]] == [["volume", "ls"], ["run", "adapters/modal/app.py::seed_volume"],
                                                    ["volume", "ls"], ["deploy", "adapters/modal/app.py"]]
    assert "seeding /models/all-MiniLM-L6-v2" in out.getvalue()
    # a folder seed_volume cannot make: refused with the upload command, even with --seed
    models = json.dumps([{"path": "/models/my-model", "device": "cuda"}])
    assert deploy.main(["modal", "--seed", "--env", f"TESSERA_MODELS={models}"], out=io.StringIO(),
                       environ=environ) == 1
    assert "modal volume put tessera-models ./<model folder> /my-model" in capsys.readouterr().err
    # the command deploy.py runs is one the real CLI parses: volume ls NAME FOLDER --json
    volume_ls = calls()[0]["argv"]
    ctx = entrypoint_cli.make_context("modal", list(volume_ls))
    group = entrypoint_cli.get_command(ctx, volume_ls[0])
    ls = group.get_command(ctx, volume_ls[1])
    assert ls.make_context("ls", list(volume_ls[2:]), parent=ctx).params == {
        "volume_name": "tessera-models", "path": "all-MiniLM-L6-v2", "json": True, "env": None}


def test_modal_refuses_a_public_endpoint_without_keys_or_proxy_auth(deploy, tmp_path, capsys):
    """Modal web endpoints are public URLs: with no Modal Secret (API keys) and no proxy auth, anyone may call
    it. Refused unless --allow-public, as the Lambda template refuses a public URL without API keys."""
    assert deploy.main(["modal", "--dry-run"], out=io.StringIO(), environ={"PATH": str(tmp_path)}) == 1
    err = capsys.readouterr().err
    assert "public URL with no key check" in err and "--allow-public" in err and "TESSERA_MODAL_PROXY_AUTH=1" in err
    for argv in (["--allow-public"], ["--env", "TESSERA_MODAL_PROXY_AUTH=1"], ["--env", "TESSERA_MODAL_SECRET=k"]):
        assert deploy.main(["modal", *argv, "--dry-run"], out=io.StringIO(), environ={"PATH": str(tmp_path)}) == 0


def test_modal_dry_run_and_missing_cli(deploy, tmp_path, capsys):
    out = io.StringIO()
    assert deploy.main(["modal", "--env", "TESSERA_MODAL_MIN_CONTAINERS=1", "--allow-public", "--dry-run"], out=out,
                       environ={"PATH": str(tmp_path)}) == 0
    lines = out.getvalue().strip().splitlines()
    assert lines[0].startswith("modal volume ls tessera-models all-MiniLM-L6-v2 --json   # /models/all-MiniLM-L6-v2")
    assert lines[-1] == "TESSERA_MODAL_MIN_CONTAINERS='1' modal deploy adapters/modal/app.py"
    assert deploy.main(["modal", "--allow-public"], out=io.StringIO(), environ={"PATH": str(tmp_path)}) == 1
    assert "modal CLI is not on PATH" in capsys.readouterr().err


def test_modal_env_file_drives_the_app_config(deploy, tmp_path):
    """The example env file, through deploy.py's reader, sets the values adapters/modal/app.py reads at
    import (checked by importing it in a fresh process with that environment; no Modal credentials)."""
    import subprocess
    import sys

    example = ROOT / "infra/modal/tessera.env.example"
    values = deploy.read_env_file(example)
    import ast

    docstring = ast.get_docstring(ast.parse((ROOT / "adapters/modal/app.py").read_text()))
    documented = set(re.findall(r"TESSERA_[A-Z_]+", docstring))
    assert set(values) | {"TESSERA_API_KEYS"} == documented  # the keys live in the named Modal Secret
    values.update(TESSERA_MODAL_GPU="A10G,L4", TESSERA_MODAL_MIN_CONTAINERS="1", TESSERA_MODAL_MAX_CONTAINERS="9")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), **values}
    probe = ("import importlib.util, json; s = importlib.util.spec_from_file_location('m', 'adapters/modal/app.py'); "
             "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); "
             "d = m.DEPLOY; print(json.dumps([d.gpus, d.min_containers, d.max_containers, d.scaledown_s, "
             "d.max_inputs, d.volume_name, json.loads(d.models)[0]['dtype'], [repr(s) for s in m.SECRETS]]))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [
        ["A10G", "L4"], 1, 9, 300, 64, "tessera-models", "float16", ["modal.Secret.from_name('tessera-keys')"]]
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        bad = tmp_path / "bad.env"
        bad.write_text("# ok\nNOT A PAIR\n")
        deploy.read_env_file(bad)


def test_invoke_sagemaker_names_the_inference_component(fake_aws):
    """scripts/invoke_sagemaker.py --inference-component: the InferenceComponentName parameter is sent."""
    import boto3

    script = load_script("invoke_sagemaker")
    client = boto3.client("sagemaker-runtime", region_name="us-east-1")
    body = {"input": ["a"]}
    answer = json.dumps({"object": "list", "data": []}).encode()
    from botocore.response import StreamingBody

    with Stubber(client) as stub:
        stub.add_response("invoke_endpoint", {"Body": StreamingBody(io.BytesIO(answer), len(answer)),
                                              "ContentType": "application/json"},
                          {"EndpointName": "tessera-sm", "InferenceComponentName": "tessera-sm-model",
                           "Body": json.dumps(body, separators=(",", ":")).encode(), "ContentType": "application/json",
                           "Accept": "application/json", "CustomAttributes": "route=embeddings"})
        assert script.invoke(client, "tessera-sm", body, inference_component="tessera-sm-model") == {
            "object": "list", "data": []}
        stub.assert_no_pending_responses()
    assert "InferenceComponentName" not in script.request_params("e", body)


# --- parameters checked against the template (dry run or not), placeholder secrets, missing files -----------

def _refused(deploy, argv, capsys) -> str:
    assert deploy.main(argv, out=io.StringIO()) == 1
    return capsys.readouterr().err


def test_dry_run_checks_parameters_against_the_template(deploy, capsys):
    err = _refused(deploy, ["lambda", "--image-uri", IMAGE, "--param", "MemorySize=99999", "--param", "Bogus=1",
                            "--param", "Architecture=riscv", "--param", "Timeout=ten", "--dry-run"], capsys)
    assert "MemorySize=99999: above MaxValue 10240" in err
    assert "Bogus: not a parameter of this template" in err
    assert "Architecture='riscv': not one of ['arm64', 'x86_64']" in err
    assert "Timeout='ten': not a number" in err
    err = _refused(deploy, ["lambda", "--image-uri", "my-image:latest", "--dry-run"], capsys)
    assert "ImageUri='my-image:latest': does not match" in err
    # the template's own Rules: a public URL needs API keys
    err = _refused(deploy, ["lambda", "--image-uri", IMAGE, "--param", "AuthType=NONE", "--dry-run"], capsys)
    assert "rule PublicUrlNeedsApiKeys: AuthType NONE makes the function URL public" in err
    # a placeholder is not a secret (and is never echoed as one)
    err = _refused(deploy, ["lambda", "--image-uri", IMAGE, "--param", "AuthType=NONE",
                            "--param", 'ApiKeys=["change-me"]', "--dry-run"], capsys)
    assert "ApiKeys: holds a placeholder ('change-me')" in err
    err = _refused(deploy, ["sagemaker", "--bucket", "my-models", "--param", "MinInstances=0", "--dry-run"], capsys)
    assert "rule InstancesModeNeedsOneInstance" in err
    err = _refused(deploy, ["sagemaker", "--bucket", "My_Bucket", "--param", "Mode=fast",
                            "--param", "StartupHealthCheckTimeout=30", "--dry-run"], capsys)
    assert "ModelBucket='My_Bucket': does not match" in err and "Mode='fast': not one of" in err
    assert "StartupHealthCheckTimeout=30: below MinValue 60" in err
    # scale to zero is fine in inference-component mode (the rule's condition is false)
    assert deploy.main(["sagemaker", "--bucket", "my-models", "--param", "Mode=inference-component",
                        "--param", "MinInstances=0", "--dry-run"], out=io.StringIO()) == 0


def test_the_shipped_parameter_files_pass_the_check(deploy):
    template = deploy.load_template(SAGEMAKER_TEMPLATE)
    for path in sorted((ROOT / "infra/sagemaker").glob("params-*.json")):
        assert deploy.check_parameters(template, {**deploy.load_params_file(path), "ModelBucket": "b-1"}) == [], path


def test_missing_files_are_one_line_errors(deploy, tmp_path, capsys):
    err = _refused(deploy, ["modal", "--env-file", str(tmp_path / "tessera.env"), "--dry-run"], capsys)
    assert err.count("\n") == 1 and err.startswith("error: --env-file") and "no such file" in err
    assert "Traceback" not in err
    err = _refused(deploy, ["sagemaker", "--bucket", "b-1", "--params-file", str(tmp_path / "p.json"), "--dry-run"],
                   capsys)
    assert err.count("\n") == 1 and "no such file" in err


def test_modal_refuses_the_example_files_placeholder_key(deploy, tmp_path, capsys):
    example = ROOT / "infra/modal/tessera.env.example"
    assert "TESSERA_API_KEYS" not in deploy.read_env_file(example)  # keys live in a Modal Secret
    err = _refused(deploy, ["modal", "--env-file", str(example), "--env", 'TESSERA_API_KEYS=["change-me"]',
                            "--dry-run"], capsys)
    assert "TESSERA_API_KEYS: holds a placeholder ('change-me')" in err
    # real keys but no Modal Secret to carry them: refused by the dry run too, as `modal deploy` would refuse
    # (the example file names one: TESSERA_MODAL_SECRET=tessera-keys)
    err = _refused(deploy, ["modal", "--env", 'TESSERA_API_KEYS=["k-9f2c1d"]', "--dry-run"], capsys)
    assert "put them in a Modal Secret" in err and "TESSERA_MODAL_SECRET=tessera-keys" in err and "k-9f2c1d" not in err
    out = io.StringIO()
    assert deploy.main(["modal", "--env-file", str(example), "--env", 'TESSERA_API_KEYS=["k-9f2c1d"]', "--dry-run"],
                       out=out, environ={"PATH": str(tmp_path)}) == 0
    assert "k-9f2c1d" not in out.getvalue()


def test_modal_key_check_runs_from_the_script_outside_the_checkout(tmp_path):
    """``python scripts/deploy.py`` from another folder, nothing on PYTHONPATH: the app's own check
    (adapters/modal/settings.py) is reached by the script itself."""
    import subprocess
    import sys

    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "deploy.py"), "modal", "--env",
                           'TESSERA_API_KEYS=["k-9f2c1d"]', "--dry-run"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.startswith("error: TESSERA_API_KEYS is set") and "k-9f2c1d" not in done.stderr


# --- a stack left in ROLLBACK_COMPLETE ------------------------------------------------------------------------

def test_rollback_complete_stack_is_deleted_and_created_again(deploy, clients):
    cfn, sm = clients
    name = {"StackName": "tessera"}
    params = {"ImageUri": IMAGE}
    out = io.StringIO()
    sleeps = []
    with Stubber(cfn) as stub:
        stub.add_response("describe_stacks", {"Stacks": [stack("tessera", "ROLLBACK_COMPLETE")]}, name)
        stub.add_response("delete_stack", {}, name)
        stub.add_response("describe_stacks", {"Stacks": [stack("tessera", "DELETE_IN_PROGRESS")]}, name)
        missing(stub, "tessera")
        stub.add_response("create_stack", {"StackId": "id"},
                          {**expected_request("lambda", "tessera", params), "OnFailure": "ROLLBACK"})
        stub.add_response("describe_stack_events", {"StackEvents": [event("1", "tessera", "CREATE_COMPLETE")]}, name)
        stub.add_response("describe_stacks", {"Stacks": [stack("tessera", "CREATE_COMPLETE", {"FunctionUrl": URL})]},
                          name)
        assert deploy.main(["lambda", "--image-uri", IMAGE, "--poll", "2"], out=out, clients=(cfn, sm),
                           sleep=sleeps.append) == 0
        stub.assert_no_pending_responses()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("stack tessera is in ROLLBACK_COMPLETE") and "deleting it" in lines[0]
    assert lines[1:3] == ["  deleted tessera", "creating stack tessera"]
    assert lines[-1] == f"FunctionUrl: {URL}" and sleeps == [2.0]


def test_rollback_delete_failure_is_reported(deploy, clients, capsys):
    cfn, sm = clients
    name = {"StackName": "tessera"}
    with Stubber(cfn) as stub:
        stub.add_response("describe_stacks", {"Stacks": [stack("tessera", "ROLLBACK_COMPLETE")]}, name)
        stub.add_response("delete_stack", {}, name)
        stub.add_response("describe_stacks", {"Stacks": [stack("tessera", "DELETE_FAILED")]}, name)
        assert deploy.main(["lambda", "--image-uri", IMAGE], out=io.StringIO(), clients=(cfn, sm), sleep=None) == 1
    assert "DELETE_FAILED" in capsys.readouterr().err


# --- Batch Transform ------------------------------------------------------------------------------------------

def _transform_params(model: str) -> dict:
    return {"TransformJobName": "embed-corpus", "ModelName": model, "MaxConcurrentTransforms": 2,
            "MaxPayloadInMB": 6, "BatchStrategy": "MultiRecord",
            "ModelClientConfig": {"InvocationsTimeoutInSeconds": 600, "InvocationsMaxRetries": 1},
            "Environment": {"TESSERA_SAGEMAKER_MAX_RESPONSE_BYTES": "0", "TESSERA_REQUEST_TIMEOUT_S": "595",
                            "TESSERA_SAGEMAKER_ROUTE": "embeddings"},
            "TransformInput": {"DataSource": {"S3DataSource": {"S3DataType": "S3Prefix",
                                                               "S3Uri": "s3://my-data/docs/"}},
                               "ContentType": "application/jsonlines", "CompressionType": "None",
                               "SplitType": "Line"},
            "TransformOutput": {"S3OutputPath": "s3://my-data/embeddings/", "Accept": "application/jsonlines",
                                "AssembleWith": "Line"},
            # Batch Transform's default GPU driver is 470 (AWS, inference-gpu-drivers), which cannot run the
            # CUDA 13 image; 535 runs it through the image's forward-compatibility libraries
            "TransformResources": {"InstanceType": "ml.g6.xlarge", "InstanceCount": 3,
                                   "TransformAmiVersion": "al2-ami-sagemaker-batch-gpu-535"},
            "Tags": [{"Key": "project", "Value": "tessera"}]}


@pytest.fixture
def sdk(fake_aws, monkeypatch):
    """A boto3 session and the SageMaker client that the SDK's resources (sagemaker-core) use for it: the
    SDK caches one client per session and region, so a Stubber on that client answers the SDK's calls.
    Any socket connection (telemetry, a client the Stubber does not cover) fails the test."""
    import socket

    import boto3
    from sagemaker.core.utils.utils import SageMakerClient

    def refuse(self, address):
        raise AssertionError(f"a connection to {address} was attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)

    session = boto3.session.Session(region_name="us-east-1")
    return session, SageMakerClient(session=session, region_name="us-east-1").sagemaker_client


def test_transform_job_from_the_stacks_model(deploy, clients, sdk):
    cfn, _ = clients
    session, sm = sdk
    arn = "arn:aws:sagemaker:us-east-1:123456789012:transform-job/embed-corpus"
    out = io.StringIO()
    with Stubber(cfn) as cstub, Stubber(sm) as sstub:
        cstub.add_response("describe_stacks", {"Stacks": [
            stack("tessera-sm", "CREATE_COMPLETE", {"EndpointName": "tessera-sm", "ModelName": "Model-abc123"})]},
            {"StackName": "tessera-sm"})
        sstub.add_response("create_transform_job", {"TransformJobArn": arn}, _transform_params("Model-abc123"))
        for status in ("InProgress", "InProgress", "InProgress", "Completed"):  # create's own describe first
            sstub.add_response("describe_transform_job", {
                "TransformJobName": "embed-corpus", "TransformJobArn": arn, "TransformJobStatus": status,
                "ModelName": "Model-abc123", "CreationTime": NOW,
                "TransformInput": _transform_params("")["TransformInput"],
                "TransformResources": {"InstanceType": "ml.g6.xlarge", "InstanceCount": 3}},
                {"TransformJobName": "embed-corpus"})
        assert deploy.main(["transform", "--input", "s3://my-data/docs", "--output", "s3://my-data/embeddings/",
                            "--job-name", "embed-corpus", "--instance-count", "3", "--route", "embeddings"],
                           out=out, clients=(cfn, None), session=session, sleep=lambda s: None) == 0
        cstub.assert_no_pending_responses()
        sstub.assert_no_pending_responses()
    assert out.getvalue().splitlines() == [
        "started transform job embed-corpus on model Model-abc123", "  transform job embed-corpus: InProgress",
        "  transform job embed-corpus: Completed", f"TransformJobArn: {arn}", "Output: s3://my-data/embeddings/"]


def test_transform_failure_and_dry_run(deploy, clients, sdk, capsys, monkeypatch):
    cfn, _ = clients
    session, sm = sdk
    arn = "arn:aws:sagemaker:us-east-1:123456789012:transform-job/j"
    params = {**_transform_params("m"), "TransformJobName": "j", "TransformResources": {
        "InstanceType": "ml.g6.xlarge", "InstanceCount": 1, "TransformAmiVersion": "al2-ami-sagemaker-batch-gpu-535"},
        "DataProcessing": {"JoinSource": "Input"}}
    params["Environment"] = {"TESSERA_SAGEMAKER_MAX_RESPONSE_BYTES": "0", "TESSERA_REQUEST_TIMEOUT_S": "595"}
    with Stubber(sm) as stub:
        stub.add_response("create_transform_job", {"TransformJobArn": arn}, params)
        stub.add_response("describe_transform_job", {
            "TransformJobName": "j", "TransformJobArn": arn, "TransformJobStatus": "InProgress", "ModelName": "m",
            "CreationTime": NOW, "TransformInput": params["TransformInput"],
            "TransformResources": params["TransformResources"]}, {"TransformJobName": "j"})
        stub.add_response("describe_transform_job", {
            "TransformJobName": "j", "TransformJobArn": arn, "TransformJobStatus": "Failed", "ModelName": "m",
            "CreationTime": NOW, "FailureReason": "ClientError: See job logs", "TransformInput": params["TransformInput"],
            "TransformResources": params["TransformResources"]}, {"TransformJobName": "j"})
        assert deploy.main(["transform", "--model-name", "m", "--input", "s3://my-data/docs/", "--output",
                            "s3://my-data/embeddings/", "--job-name", "j", "--join-input"],
                           out=io.StringIO(), clients=(cfn, None), session=session, sleep=lambda s: None) == 1
    assert "transform job j: Failed ClientError: See job logs" in capsys.readouterr().err
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var, raising=False)
    out = io.StringIO()
    assert deploy.main(["transform", "--input", "s3://my-data/docs/", "--output", "s3://my-data/out/",
                        "--job-name", "j", "--dry-run"], out=out) == 0
    calls = [line.split("(", 1)[0] for line in out.getvalue().splitlines() if not line.startswith("  ")]
    assert calls == ["cloudformation.describe_stacks", "sagemaker.create_transform_job",
                     "sagemaker.describe_transform_job"]
    create = json.loads(out.getvalue().splitlines()[1].split("(", 1)[1].rstrip(")"))
    assert create["ModelName"] == "<Outputs.ModelName>" and create["TransformInput"]["SplitType"] == "Line"
    for argv, message in ((["--input", "my-data/docs"], "--input must be an s3://"),
                          (["--input", "s3://my-data/d/", "--max-payload-mb", "150"], "--max-payload-mb must be 1..100")):
        assert deploy.main(["transform", "--output", "s3://my-data/o/", *argv, "--dry-run"], out=io.StringIO()) == 1
        assert message in capsys.readouterr().err


def test_sagemaker_template_outputs_the_model_name():
    from .conftest import parse_template

    assert parse_template(SAGEMAKER_TEMPLATE)["Outputs"]["ModelName"]["Value"] == {"Fn::GetAtt": ["Model", "ModelName"]}


def test_the_documented_dry_run_refusal_is_what_it_prints(deploy, capsys):
    """docs/deploy.md's example command, run as written (with $IMAGE set), prints the documented lines."""
    doc = (ROOT / "docs/deploy.md").read_text()
    block = doc.split("python scripts/deploy.py lambda --image-uri $IMAGE --param MemorySize=99999", 1)[1]
    command = "--param MemorySize=99999" + block.split("\n", 1)[0]
    documented = [line[2:] for line in block.split("```", 1)[0].split("\n")[1:] if line.startswith("# ")]
    argv = ["lambda", "--image-uri", IMAGE, *command.split()]
    assert deploy.main(argv, out=io.StringIO()) == 1
    printed = capsys.readouterr().err.splitlines()
    assert len(printed) == len(documented) == 3
    for want, got in zip(documented, printed):
        assert got.startswith(want.removesuffix("...)").rstrip(", ")), (want, got)
