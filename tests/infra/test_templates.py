"""Every template in infra/ passes cfn-lint (offline), and says what docs/deploy.md promises.

cfn-lint validates resource properties against the CloudFormation schemas it ships (SAM's
AWS::Serverless::Function included). The parameter constraints and the Rules sections, which cfn-lint
does not evaluate, are checked by the check scripts/deploy.py applies before any call
(``check_parameters``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cfnlint.api import ManualArgs, lint_file

from tests.support.modules import load_script

from .conftest import LAMBDA_TEMPLATE, PARAM_FILES, ROOT, SAGEMAKER_TEMPLATE, parse_template, read_params

TEMPLATES = sorted((ROOT / "infra").rglob("*.yaml"))
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/tessera-lambda:arm64"


def lint(path: Path, **options) -> list:
    return lint_file(path, config=ManualArgs(regions=["us-east-1", "eu-west-1"], **options))


def test_infra_has_both_templates():
    assert LAMBDA_TEMPLATE in TEMPLATES and SAGEMAKER_TEMPLATE in TEMPLATES


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: str(p.relative_to(ROOT)))
def test_template_passes_cfn_lint(path):
    matches = lint(path)
    assert matches == [], "\n".join(str(m) for m in matches)


def test_cfn_lint_catches_a_broken_template(tmp_path):
    """The linter is live: an unknown property and a wrong GetAtt in a copy of each template fail."""
    broken = tmp_path / "template.yaml"
    broken.write_text(LAMBDA_TEMPLATE.read_text().replace(
        "      MemorySize: !Ref MemorySize\n", "      MemorySize: !Ref MemorySize\n      MemorySizeMb: 3\n"))
    assert any("MemorySizeMb" in str(m) for m in lint(broken))
    broken.write_text(SAGEMAKER_TEMPLATE.read_text().replace(
        "!GetAtt Endpoint.EndpointName", "!GetAtt Endpoint.Name"))
    assert any(m.rule.id.startswith("E") for m in lint(broken))


@pytest.mark.parametrize("path", PARAM_FILES, ids=lambda p: p.name)
def test_parameter_files_lint_with_the_template(path, tmp_path):
    """deploy.py adds ModelBucket (--bucket); with it, each file lints clean against the template."""
    params = json.loads(path.read_text()) + [{"ParameterKey": "ModelBucket", "ParameterValue": "my-models"}]
    merged = tmp_path / path.name
    merged.write_text(json.dumps(params))
    matches = lint_file(SAGEMAKER_TEMPLATE, config=ManualArgs(regions=["us-east-1"], parameter_files=[str(merged)]))
    assert matches == [], "\n".join(str(m) for m in matches)


def check_parameters(template: dict, given: dict[str, str]) -> list[str]:
    """What deploy.py refuses about ``given`` for ``template``: parameter constraints, then the Rules."""
    return load_script("deploy").check_parameters(template, given)


# --- Lambda ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lam() -> dict:
    return parse_template(LAMBDA_TEMPLATE)


def test_lambda_is_a_sam_image_function_with_sized_parameters(lam):
    assert lam["Transform"] == "AWS::Serverless-2016-10-31"
    fn = lam["Resources"]["TesseraFunction"]
    assert fn["Type"] == "AWS::Serverless::Function"
    props = fn["Properties"]
    assert props["PackageType"] == "Image" and props["ImageUri"] == {"Ref": "ImageUri"}
    assert props["Architectures"] == [{"Ref": "Architecture"}]
    params = lam["Parameters"]
    assert params["Architecture"]["Default"] == "arm64" and set(params["Architecture"]["AllowedValues"]) == {
        "arm64", "x86_64"}
    assert props["MemorySize"] == {"Ref": "MemorySize"} and props["Timeout"] == {"Ref": "Timeout"}
    assert props["EphemeralStorage"] == {"Size": {"Ref": "EphemeralStorage"}}
    assert params["MemorySize"]["MaxValue"] == 10240 and params["EphemeralStorage"]["MaxValue"] == 10240


def test_lambda_url_defaults_to_iam_and_public_needs_api_keys(lam):
    params = lam["Parameters"]
    assert params["AuthType"]["Default"] == "AWS_IAM"
    assert set(params["AuthType"]["AllowedValues"]) == {"AWS_IAM", "NONE"}
    assert params["ApiKeys"]["NoEcho"] is True
    url = lam["Resources"]["FunctionUrl"]
    assert url["Type"] == "AWS::Lambda::Url" and url["Properties"]["AuthType"] == {"Ref": "AuthType"}
    env = lam["Resources"]["TesseraFunction"]["Properties"]["Environment"]["Variables"]
    assert env["TESSERA_API_KEYS"] == {"Fn::If": ["HasApiKeys", {"Ref": "ApiKeys"}, {"Ref": "AWS::NoValue"}]}
    # the public permissions exist only for NONE, and are the two a function URL needs
    public = {k: v for k, v in lam["Resources"].items() if v["Type"] == "AWS::Lambda::Permission"}
    assert {v["Condition"] for v in public.values()} == {"PublicUrl"}
    assert {v["Properties"]["Action"] for v in public.values()} == {"lambda:InvokeFunctionUrl", "lambda:InvokeFunction"}
    assert lam["Conditions"]["PublicUrl"] == {"Fn::Equals": [{"Ref": "AuthType"}, "NONE"]}

    base = {"ImageUri": IMAGE}
    assert check_parameters(lam, base) == []
    assert check_parameters(lam, {**base, "AuthType": "AWS_IAM"}) == []
    assert check_parameters(lam, {**base, "AuthType": "NONE"}) == [
        "rule PublicUrlNeedsApiKeys: AuthType NONE makes the function URL public; set ApiKeys (a JSON list of keys)."]
    assert check_parameters(lam, {**base, "AuthType": "NONE", "ApiKeys": '["k1"]'}) == []
    allowed = lam["Parameters"]["AuthType"]["AllowedValues"]
    assert check_parameters(lam, {**base, "AuthType": "PUBLIC"}) == [f"AuthType='PUBLIC': not one of {allowed}"]
    assert check_parameters(lam, {**base, "Architecture": "x86_64", "MemorySize": "10240"}) == []
    assert check_parameters(lam, {"ImageUri": "docker.io/tessera:latest"})  # Lambda pulls from ECR only


def test_lambda_concurrency_is_optional(lam):
    props = lam["Resources"]["TesseraFunction"]["Properties"]
    assert props["AutoPublishAlias"] == "live"
    assert props["ProvisionedConcurrencyConfig"]["Fn::If"][0] == "HasProvisioned"
    assert props["ProvisionedConcurrencyConfig"]["Fn::If"][2] == {"Ref": "AWS::NoValue"}
    assert props["ReservedConcurrentExecutions"] == {
        "Fn::If": ["HasReserved", {"Ref": "ReservedConcurrency"}, {"Ref": "AWS::NoValue"}]}
    assert lam["Parameters"]["ProvisionedConcurrency"]["Default"] == 0
    assert lam["Parameters"]["ReservedConcurrency"]["Default"] == -1
    # the URL points at the alias, where provisioned concurrency lives
    assert lam["Resources"]["FunctionUrl"]["Properties"]["TargetFunctionArn"] == ALIAS


#: the "live" alias of whichever function the package type creates
ALIAS = {"Fn::If": ["IsZip", {"Ref": "TesseraZipFunction.Alias"}, {"Ref": "TesseraFunction.Alias"}]}


def test_lambda_zip_function_with_snap_start_beside_the_image(lam):
    """PackageType Zip: the zip of scripts/build_lambda_zip.py on python3.12 (x86_64, what the build targets)
    with SnapStart on published versions, instead of the image function; the URL, permissions and outputs
    follow the one that exists."""
    res, params = lam["Resources"], lam["Parameters"]
    assert params["PackageType"]["Default"] == "Image" and set(params["PackageType"]["AllowedValues"]) == {"Image", "Zip"}
    assert lam["Conditions"]["IsZip"] == {"Fn::Equals": [{"Ref": "PackageType"}, "Zip"]}
    assert res["TesseraFunction"]["Condition"] == "IsImage"
    fn = res["TesseraZipFunction"]
    assert fn["Type"] == "AWS::Serverless::Function" and fn["Condition"] == "IsZip"
    props = fn["Properties"]
    assert props["PackageType"] == "Zip" and props["Runtime"] == "python3.12" and props["Handler"] == "handler.handler"
    assert props["CodeUri"] == {"Bucket": {"Ref": "ZipBucket"}, "Key": {"Ref": "ZipKey"}}
    assert props["Architectures"] == ["x86_64"] and props["SnapStart"] == {"ApplyOn": "PublishedVersions"}
    assert props["AutoPublishAlias"] == "live" and "ProvisionedConcurrencyConfig" not in props
    build = load_script("build_lambda_zip")
    assert props["Environment"]["Variables"]["TESSERA_MODELS"]["Fn::If"][2] == build.models_env()
    for key in ("Url", "Permission"):
        for resource in (v for v in res.values() if v["Type"] == f"AWS::Lambda::{key}"):
            assert ALIAS in resource["Properties"].values()
    assert lam["Outputs"]["AliasArn"]["Value"] == ALIAS

    assert check_parameters(lam, {"ImageUri": IMAGE}) == []
    assert check_parameters(lam, {}) == ["rule ImageNeedsImageUri: PackageType Image needs ImageUri (the image pushed to ECR)."]
    zipped = {"PackageType": "Zip", "ZipBucket": "my-code", "ZipKey": "tessera-lambda.zip"}
    assert check_parameters(lam, zipped) == []
    assert check_parameters(lam, {"PackageType": "Zip"}) == [
        "rule ZipNeedsItsObject: PackageType Zip needs ZipBucket and ZipKey (the uploaded zip)."]
    assert check_parameters(lam, {**zipped, "ProvisionedConcurrency": "2"}) == [
        "rule ZipNeedsItsObject: SnapStart and provisioned concurrency cannot be used on one version; set "
        "ProvisionedConcurrency 0."]
    assert check_parameters(lam, {**zipped, "EphemeralStorage": "1024"}) == [
        "rule ZipNeedsItsObject: SnapStart supports 512 MB of ephemeral storage only."]


def test_lambda_logs_and_outputs(lam):
    group = lam["Resources"]["LogGroup"]
    assert group["Type"] == "AWS::Logs::LogGroup"
    assert group["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}
    assert lam["Resources"]["TesseraFunction"]["Properties"]["LoggingConfig"]["LogGroup"] == {"Ref": "LogGroup"}


def test_lambda_logging_config_maps_the_log_level(lam):
    """LogFormat JSON: the level reaches the runtime as AWS_LAMBDA_LOG_LEVEL (ApplicationLogLevel), under
    Lambda's names (WARN, not warning); every LogLevel value has one. Text: TESSERA_LOG_LEVEL alone."""
    props = lam["Resources"]["TesseraFunction"]["Properties"]
    config = props["LoggingConfig"]
    assert config["LogFormat"] == {"Ref": "LogFormat"}
    assert lam["Parameters"]["LogFormat"]["Default"] == "JSON"
    assert set(lam["Parameters"]["LogFormat"]["AllowedValues"]) == {"JSON", "Text"}
    assert lam["Conditions"]["JsonLogs"] == {"Fn::Equals": [{"Ref": "LogFormat"}, "JSON"]}
    assert config["ApplicationLogLevel"] == {"Fn::If": [
        "JsonLogs", {"Fn::FindInMap": ["LogLevels", {"Ref": "LogLevel"}, "Lambda"]}, {"Ref": "AWS::NoValue"}]}
    levels = lam["Mappings"]["LogLevels"]
    assert set(levels) == set(lam["Parameters"]["LogLevel"]["AllowedValues"])
    lambda_levels = {"TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL"}  # what ApplicationLogLevel accepts
    assert all(v["Lambda"] in lambda_levels for v in levels.values())
    from core.logs import level_number

    for ours, theirs in levels.items():  # the handler reads both names as the same level
        assert level_number(ours) == level_number(theirs["Lambda"])
    assert props["Environment"]["Variables"]["TESSERA_LOG_LEVEL"] == {"Ref": "LogLevel"}
    assert lam["Outputs"]["FunctionUrl"]["Value"] == {"Fn::GetAtt": ["FunctionUrl", "FunctionUrl"]}


# --- SageMaker -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sm() -> dict:
    return parse_template(SAGEMAKER_TEMPLATE)


def statements(sm: dict) -> list[dict]:
    role = sm["Resources"]["ExecutionRole"]["Properties"]
    return [s for policy in role["Policies"] for s in policy["PolicyDocument"]["Statement"]]


def as_list(value):
    return value if isinstance(value, list) else [value]


def test_sagemaker_role_is_least_privilege(sm):
    by_sid = {s["Sid"]: s for s in statements(sm)}
    assert set(by_sid) == {"ReadModelArtifacts", "PullImage", "EcrLoginHasNoResourceLevelPermissions",
                           "WriteEndpointLogs"}
    assert by_sid["ReadModelArtifacts"]["Action"] == "s3:GetObject"
    assert by_sid["ReadModelArtifacts"]["Resource"] == {
        "Fn::Sub": "arn:${AWS::Partition}:s3:::${ModelBucket}/${ModelPrefix}*"}
    assert by_sid["PullImage"]["Resource"] == {
        "Fn::Sub": "arn:${AWS::Partition}:ecr:${AWS::Region}:${AWS::AccountId}:repository/${EcrRepositoryName}"}
    # the one "*": ecr:GetAuthorizationToken has no resource-level permissions in IAM
    for sid, statement in by_sid.items():
        for resource in as_list(statement["Resource"]):
            if resource == "*":
                assert sid == "EcrLoginHasNoResourceLevelPermissions"
                assert statement["Action"] == "ecr:GetAuthorizationToken"
            else:  # every other resource is an ARN built from this stack's parameters
                arn = resource["Fn::Sub"]
                assert arn.startswith("arn:${AWS::Partition}:") and "*" not in arn.replace("}*", "}").removesuffix(":*")
                assert any(p in arn for p in ("${ModelBucket}", "${EcrRepositoryName}", "${AWS::StackName}"))
    for resource in by_sid["WriteEndpointLogs"]["Resource"]:
        assert "${AWS::StackName}" in resource["Fn::Sub"]
    for statement in statements(sm):
        assert all(not a.endswith(":*") for a in as_list(statement["Action"]))
    # the prefix parameter cannot smuggle a wildcard in
    assert check_parameters(sm, {"ModelBucket": "b-1", "ModelPrefix": "*"})
    assert check_parameters(sm, {"ModelBucket": "b-1", "ModelPrefix": "models/minilm/"}) == []


def test_sagemaker_timeouts_and_scaling(sm):
    res = sm["Resources"]
    variant = res["EndpointConfig"]["Properties"]["ProductionVariants"][0]
    assert variant["ContainerStartupHealthCheckTimeoutInSeconds"]["Fn::If"][1] == {"Ref": "StartupHealthCheckTimeout"}
    assert variant["ModelDataDownloadTimeoutInSeconds"]["Fn::If"][1] == {"Ref": "ModelDownloadTimeout"}
    assert sm["Parameters"]["StartupHealthCheckTimeout"]["Default"] >= 600
    target = res["VariantScalableTarget"]["Properties"]
    assert target["ScalableDimension"] == "sagemaker:variant:DesiredInstanceCount"
    assert (target["MinCapacity"], target["MaxCapacity"]) == ({"Ref": "MinInstances"}, {"Ref": "MaxInstances"})
    tracking = res["VariantScalingPolicy"]["Properties"]["TargetTrackingScalingPolicyConfiguration"]
    assert tracking["PredefinedMetricSpecification"]["PredefinedMetricType"] == "SageMakerVariantInvocationsPerInstance"
    assert tracking["TargetValue"] == {"Ref": "TargetInvocationsPerInstance"}


def test_sagemaker_inference_component_mode_scales_to_zero(sm):
    res = sm["Resources"]
    component = res["InferenceComponent"]
    assert component["Type"] == "AWS::SageMaker::InferenceComponent" and component["Condition"] == "Components"
    startup = component["Properties"]["Specification"]["StartupParameters"]
    assert startup == {"ContainerStartupHealthCheckTimeoutInSeconds": {"Ref": "StartupHealthCheckTimeout"},
                       "ModelDataDownloadTimeoutInSeconds": {"Ref": "ModelDownloadTimeout"}}
    managed = res["EndpointConfig"]["Properties"]["ProductionVariants"][0]["ManagedInstanceScaling"]["Fn::If"][1]
    assert managed == {"Status": "ENABLED", "MinInstanceCount": {"Ref": "MinInstances"},
                       "MaxInstanceCount": {"Ref": "MaxInstances"}}
    assert res["ComponentScalableTarget"]["Properties"]["ScalableDimension"] == (
        "sagemaker:inference-component:DesiredCopyCount")
    alarm = res["NoCapacityAlarm"]["Properties"]
    assert alarm["MetricName"] == "NoCapacityInvocationFailures"
    assert alarm["AlarmActions"] == [{"Ref": "ScaleFromZeroPolicy"}]
    base = {"ModelBucket": "my-models"}
    assert check_parameters(sm, {**base, "Mode": "inference-component", "MinInstances": "0"}) == []
    assert check_parameters(sm, {**base, "Mode": "instances", "MinInstances": "0"}) == [
        "rule InstancesModeNeedsOneInstance: Scale to zero needs Mode inference-component; in instances mode "
        "MinInstances must be at least 1."]


def _ami_driver_branches() -> dict[str, int]:
    """NVIDIA driver branch of each InferenceAmiVersion, read from AWS's own API model (botocore's
    ProductionVariant.InferenceAmiVersion documentation: "al2023-ami-sagemaker-inference-gpu-4-1 ...
    NVIDIA driver version: 580 ... CUDA version: 13.0")."""
    import re

    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    text = re.sub(r"<[^>]+>", " ", model.shape_for("ProductionVariant").members["InferenceAmiVersion"].documentation)
    found = re.findall(r"(al2\S*-ami-sagemaker-inference-gpu[\w-]*)\s+Accelerator: GPU\s+NVIDIA driver version: (\d+)",
                       text)
    assert found, "botocore's InferenceAmiVersion documentation changed shape"
    return {name: int(branch) for name, branch in found}


def test_sagemaker_cuda_defaults_run_the_cuda13_image(sm):
    """The default host runs the CUDA image: real-time GPU hosts default to driver 470 (ml.g5) or 535 (ml.g6)
    (AWS, "Best practices to minimize interruptions during GPU driver upgrades"), and the image's CUDA 13
    build needs 580 (core.cuda_driver.MIN_DRIVER_BRANCH); so the template names an InferenceAmiVersion
    whose driver AWS documents as >= 580, and puts it on the production variant."""
    import botocore.session

    from core.cuda_driver import MIN_DRIVER_BRANCH

    params = sm["Parameters"]
    ami = params["InferenceAmiVersion"]["Default"]
    assert _ami_driver_branches()[ami] >= MIN_DRIVER_BRANCH[13]
    enum = botocore.session.get_session().get_service_model("sagemaker").shape_for(
        "ProductionVariantInferenceAmiVersion").enum
    assert {v for v in params["InferenceAmiVersion"]["AllowedValues"] if v} <= set(enum)
    assert not params["InstanceType"]["Default"].startswith("ml.g5.")
    variant = sm["Resources"]["EndpointConfig"]["Properties"]["ProductionVariants"][0]
    assert variant["InferenceAmiVersion"] == {"Fn::If": ["HasAmiVersion", {"Ref": "InferenceAmiVersion"},
                                                         {"Ref": "AWS::NoValue"}]}
    for path in PARAM_FILES:  # the CUDA parameter sets keep a driver that runs the image; inf2 takes AWS's default
        given = read_params(path)
        if given["ImageTag"] == "cuda":
            assert _ami_driver_branches()[given.get("InferenceAmiVersion", ami)] >= MIN_DRIVER_BRANCH[13], path.name
        else:
            assert given["InferenceAmiVersion"] == "", path.name


@pytest.mark.parametrize("path", PARAM_FILES, ids=lambda p: p.name)
def test_parameter_files_satisfy_the_template(sm, path):
    params = read_params(path)
    assert check_parameters(sm, {**params, "ModelBucket": "my-models"}) == []


def test_parameter_sets_match_their_hardware():
    cuda = read_params(ROOT / "infra/sagemaker/params-cuda.json")
    inf2 = read_params(ROOT / "infra/sagemaker/params-inf2.json")
    assert cuda["InstanceType"].split(".")[1][:2] in ("g5", "g6") and cuda["ImageTag"] == "cuda"
    assert inf2["InstanceType"].startswith("ml.inf2.") and inf2["ImageTag"] == "neuron"
    zero = read_params(ROOT / "infra/sagemaker/params-scale-to-zero.json")
    assert zero["Mode"] == "inference-component" and zero["MinInstances"] == "0"


def sam_cli() -> str | None:
    import os
    import shutil

    return os.environ.get("TESSERA_SAM_CLI") or shutil.which("sam")


@pytest.mark.skipif(sam_cli() is None, reason="aws-sam-cli not installed (it pins pydantic~=2.13 and boto3==1.43.108, so it is not in "
                    "the dev extra; install it in its own venv and set TESSERA_SAM_CLI=/path/to/sam)")
def test_sam_validate_lint_offline(tmp_path):
    """`sam validate --lint` with no credentials, no region and telemetry off (no network needed)."""
    import subprocess

    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SAM_CLI_TELEMETRY": "0"}
    done = subprocess.run([sam_cli(), "validate", "--lint", "-t", str(LAMBDA_TEMPLATE)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "is a valid SAM Template" in done.stdout + done.stderr
