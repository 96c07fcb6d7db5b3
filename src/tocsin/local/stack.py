"""template.yaml as a stack in moto: translated by the SAM translator, created by moto's
CloudFormation, with what moto's CloudFormation skips (secrets) made beside it.

moto's CloudFormation does not apply a state machine's DefinitionSubstitutions, and
skips API Gateway v2 and a few other types (see tests/integration/test_deploy_smoke.py):
the runtime resolves the substitutions itself from the stack's resources. Neither the SAM
translator nor moto knows AWS::LanguageExtensions: its Fn::ForEach is expanded here first,
as SAM CLI (`--language-extensions`) and CloudFormation do.
"""

import copy
import functools
import io
import json
import logging
import re
import secrets
import string
import zipfile
from pathlib import Path
from typing import Any

ACCOUNT_ID = "123456789012"  # moto's default account
REGION = "us-east-1"
STACK_NAME = "tocsin"
ARTIFACT_BUCKET = "tocsin-local-artifacts"
ARTIFACT_KEY = "code.zip"
LANGUAGE_EXTENSIONS = "AWS::LanguageExtensions"
FOR_EACH = "Fn::ForEach::"


def project_root() -> Path:
    """The folder holding template.yaml: the working directory, else this checkout."""
    for candidate in (Path.cwd(), Path(__file__).resolve().parents[3]):
        if (candidate / "template.yaml").is_file():
            return candidate
    raise FileNotFoundError("template.yaml not found: run from the Tocsin project folder")


def project_template() -> dict[str, Any]:
    """template.yaml as SAM's own parser reads it, its language extensions expanded."""
    from samtranslator.yaml_helper import yaml_parse

    return expand_language_extensions(yaml_parse((project_root() / "template.yaml").read_text()))


def translate(
    template_path: Path, parameters: dict[str, str]
) -> tuple[dict[str, Any], dict[str, Path]]:
    """A SAM template (ours, or the one `sam build` writes) as CloudFormation moto can create,
    and the code folder of each function. Code and layer point at one placeholder artifact;
    the state machine's definition is inlined; the secrets are made in moto now."""
    key = (template_path.read_text(), template_path.parent, tuple(sorted(parameters.items())))
    template, code_dirs = _translated(*key)
    return _create_secrets(copy.deepcopy(template)), dict(code_dirs)


@functools.lru_cache(maxsize=8)
def _translated(
    text: str, base: Path, parameters: tuple[tuple[str, str], ...]
) -> tuple[dict[str, Any], dict[str, Path]]:
    """The SAM translator's work, kept: a process that starts many runtimes (the tests)
    translated the same template again at each start, a quarter of the start's CPU."""
    import boto3
    from samtranslator.public.translator import ManagedPolicyLoader
    from samtranslator.translator.transform import transform
    from samtranslator.yaml_helper import yaml_parse

    # The translator records its own usage metrics and warns that nobody published them.
    logging.getLogger("samtranslator.metrics.metrics").setLevel(logging.ERROR)
    template = expand_language_extensions(yaml_parse(text))
    code_dirs: dict[str, Path] = {}
    artifact = f"s3://{ARTIFACT_BUCKET}/{ARTIFACT_KEY}"
    for logical_id, resource in template["Resources"].items():
        properties = resource.get("Properties", {})
        if resource["Type"] == "AWS::Serverless::Function":
            code_dirs[logical_id] = (base / properties["CodeUri"]).resolve()
            properties["CodeUri"] = artifact
        elif resource["Type"] == "AWS::Serverless::LayerVersion":
            properties["ContentUri"] = artifact
        elif resource["Type"] == "AWS::Serverless::StateMachine":
            definition = (base / properties.pop("DefinitionUri")).read_text()
            properties["Definition"] = json.loads(definition)
    loader = ManagedPolicyLoader(boto3.client("iam"))
    return transform(template, dict(parameters), loader), code_dirs


def expand_language_extensions(template: dict[str, Any]) -> dict[str, Any]:
    """The template with its resources' Fn::ForEach loops expanded and each Ref that holds
    a function (which the transform allows) resolved, the transform itself then dropped.
    Only what template.yaml uses: literal collections, ${x} and &{x} in keys and strings,
    Ref x, and a Ref of a literal Fn::Sub or of an Fn::FindInMap of literals or of them."""
    transforms = template.get("Transform", [])
    if LANGUAGE_EXTENSIONS not in transforms:
        return template
    template["Transform"] = [t for t in transforms if t != LANGUAGE_EXTENSIONS]
    template["Resources"] = _looped(template["Resources"])
    return _resolved_refs(template, template.get("Mappings", {}))


def _looped(fragment: dict[str, Any]) -> dict[str, Any]:
    expanded: dict[str, Any] = {}
    for key, value in fragment.items():
        if not key.startswith(FOR_EACH):
            expanded[key] = value
            continue
        identifier, collection, body = value
        for item in collection:
            expanded.update(_looped(_bound(body, identifier, item)))
    return expanded


def _bound(value: Any, identifier: str, item: str) -> Any:
    """`value` with one loop's identifier replaced by the item."""
    if isinstance(value, str):
        plain = re.sub(r"[^A-Za-z0-9]", "", item)
        return value.replace(f"${{{identifier}}}", item).replace(f"&{{{identifier}}}", plain)
    if isinstance(value, list):
        return [_bound(v, identifier, item) for v in value]
    if not isinstance(value, dict):
        return value
    if value == {"Ref": identifier}:
        return item
    return {_bound(k, identifier, item): _bound(v, identifier, item) for k, v in value.items()}


def _resolved_refs(value: Any, mappings: dict[str, Any]) -> Any:
    if isinstance(value, list):
        return [_resolved_refs(v, mappings) for v in value]
    if not isinstance(value, dict):
        return value
    target = value.get("Ref")
    if isinstance(target, dict) and len(value) == 1:
        return {"Ref": _literal(target, mappings)}
    return {k: _resolved_refs(v, mappings) for k, v in value.items()}


def _literal(value: Any, mappings: dict[str, Any]) -> str:
    """A string, a literal Fn::Sub, or an Fn::FindInMap of them, as the transform resolves it."""
    if isinstance(value, str):
        return value
    if "Fn::Sub" in value and isinstance(value["Fn::Sub"], str) and "${" not in value["Fn::Sub"]:
        return str(value["Fn::Sub"])
    if "Fn::FindInMap" in value:
        name, key, attribute = (_literal(part, mappings) for part in value["Fn::FindInMap"])
        return str(mappings[name][key][attribute])
    raise ValueError(f"a Ref the runtime cannot resolve: {value}")


def _create_secrets(template: dict[str, Any]) -> dict[str, Any]:
    """moto's CloudFormation skips secrets: create them here, generated as Secrets Manager
    does for `GenerateSecretString` without punctuation, and put their ARNs in place."""
    import boto3

    client = boto3.client("secretsmanager")
    arns = {}
    for logical_id, resource in list(template["Resources"].items()):
        if resource["Type"] == "AWS::SecretsManager::Secret":
            del template["Resources"][logical_id]
            arns[logical_id] = client.create_secret(
                Name=f"{STACK_NAME}-{logical_id}",
                SecretString=_generated_secret(resource["Properties"]["GenerateSecretString"]),
            )["ARN"]
    return _replace_refs(template, arns)


def _generated_secret(generate: dict[str, Any]) -> str:
    assert generate.get("ExcludePunctuation"), "only letters and digits are generated here"
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(int(generate["PasswordLength"])))


def create_stack(
    template: dict[str, Any], parameters: dict[str, str]
) -> tuple[Any, dict[str, Any]]:
    """Create the translated template as a moto stack; the stack, and the state machine's
    DefinitionSubstitutions (which moto ignores: the runtime applies them itself)."""
    import boto3
    from moto.cloudformation.models import cloudformation_backends

    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=ARTIFACT_BUCKET)
    s3.put_object(Bucket=ARTIFACT_BUCKET, Key=ARTIFACT_KEY, Body=_empty_zip())
    substitutions: dict[str, Any] = {}
    for resource in template["Resources"].values():
        if resource["Type"] == "AWS::StepFunctions::StateMachine":
            substitutions = resource["Properties"].pop("DefinitionSubstitutions", {})
    # Straight to moto's backend: the request's URL-encoded template cost 80 ms a start.
    stack = cloudformation_backends[ACCOUNT_ID][REGION].create_stack(
        name=STACK_NAME, template=json.dumps(template), parameters=parameters
    )
    return stack, substitutions


def _replace_refs(value: Any, values: dict[str, str]) -> Any:
    if isinstance(value, dict):
        if set(value) == {"Ref"} and value["Ref"] in values:
            return values[value["Ref"]]
        return {key: _replace_refs(item, values) for key, item in value.items()}
    if isinstance(value, list):
        return [_replace_refs(item, values) for item in value]
    return value


def _empty_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("app.py", "# the embedded runtime runs the handlers in-process\n")
    return buffer.getvalue()
