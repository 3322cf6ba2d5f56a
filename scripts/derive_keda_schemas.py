"""Derive JSON Schemas for KEDA's custom resources from KEDA's own CRDs, for the offline check of deploy/kubernetes.

    git -C <keda git dir> show v2.20.2:config/crd/bases/keda.sh_scaledobjects.yaml > /tmp/keda.sh_scaledobjects.yaml
    git -C <keda git dir> show v2.20.2:config/crd/bases/keda.sh_triggerauthentications.yaml > /tmp/keda.sh_triggerauthentications.yaml
    python scripts/derive_keda_schemas.py --keda-version v2.20.2 /tmp/keda.sh_scaledobjects.yaml /tmp/keda.sh_triggerauthentications.yaml
    python scripts/derive_keda_schemas.py --keda-version v2.20.2 --git-dir <keda git dir>           # the same, read with `git show`
    ... --check                                                                                     # exit 1 if a committed file differs

For each CRD it takes the ``openAPIV3Schema`` of the served (storage) version and writes it to
``deploy/kubernetes/schemas/keda-<kind>-<version>.json`` as a JSON Schema (draft 2020-12), with the
KEDA version and the CRD's path in KEDA's repository in a top-level ``$comment``. The CRD files
themselves are not committed. Changes to the CRD's schema, all of them what the API server does too:

- every object that lists ``properties`` and neither ``additionalProperties`` nor
  ``x-kubernetes-preserve-unknown-fields`` gets ``additionalProperties: false``, as strict field
  validation (``kubectl apply --validate=strict``) rejects an unknown field instead of dropping it;
- ``nullable: true`` becomes a ``"null"`` type; ``x-kubernetes-int-or-string`` without ``anyOf`` gets one;
- ``apiVersion`` and ``kind`` are fixed to the CRD's group/version and kind, and ``metadata.name`` is required.

The CEL rules (``x-kubernetes-validations``) are kept but JSON Schema does not evaluate them; the
test (tests/unit/test_kubernetes_manifests.py) checks the one that matters here (min <= max replicas).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator

REPO = Path(__file__).resolve().parents[1]
OUTPUT_DIR = REPO / "deploy" / "kubernetes" / "schemas"
CRD_DIR = "config/crd/bases"
"""Where the CRDs live in KEDA's repository (github.com/kedacore/keda)."""
DEFAULT_CRDS = ("keda.sh_scaledobjects.yaml", "keda.sh_triggerauthentications.yaml")

KNOWN_KEYWORDS = {
    "type", "description", "properties", "required", "items", "additionalProperties", "enum", "format", "default", "pattern",
    "minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems", "anyOf", "allOf", "oneOf", "nullable",
    "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type", "x-kubernetes-validations", "x-kubernetes-embedded-resource",
}  # fmt: skip
"""The OpenAPI keywords this conversion understands; any other one stops it (its meaning might differ in JSON Schema)."""
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class DeriveError(Exception):
    pass


def to_json_schema(node: Any, where: str = "#") -> Any:
    """One OpenAPI v3 structural-schema node as JSON Schema (pure)."""
    if not isinstance(node, dict):
        raise DeriveError(f"{where}: a schema must be a mapping, not {type(node).__name__}")
    unknown = set(node) - KNOWN_KEYWORDS
    if unknown:
        raise DeriveError(f"{where}: unknown schema keyword(s) {sorted(unknown)}: extend scripts/derive_keda_schemas.py")
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: to_json_schema(child, f"{where}/properties/{name}") for name, child in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = to_json_schema(value, f"{where}/{key}")
        elif key in ("anyOf", "allOf", "oneOf"):
            out[key] = [to_json_schema(child, f"{where}/{key}/{index}") for index, child in enumerate(value)]
        elif key != "nullable":
            out[key] = value
    if node.get("nullable") is True and "type" in out:
        out["type"] = [out["type"], "null"]
    if node.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if "properties" in node and "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def served_version(crd: dict[str, Any], source: str) -> dict[str, Any]:
    """The version entry the API server serves and stores (the one manifests are written against)."""
    if crd.get("kind") != "CustomResourceDefinition" or crd.get("apiVersion") != "apiextensions.k8s.io/v1":
        raise DeriveError(f"{source}: not an apiextensions.k8s.io/v1 CustomResourceDefinition")
    served = [version for version in crd["spec"]["versions"] if version.get("served")]
    stored = [version for version in served if version.get("storage")] or served
    if not stored:
        raise DeriveError(f"{source}: no served version")
    return stored[0]


def derive(crd_text: str, source_name: str, keda_version: str) -> tuple[str, str]:
    """(output file name, its text) for one CRD (deterministic: sorted keys, one-space indent)."""
    crd = yaml.safe_load(crd_text)
    version = served_version(crd, source_name)
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    schema = to_json_schema(version["schema"]["openAPIV3Schema"])
    api_version = f"{group}/{version['name']}"
    schema["properties"]["apiVersion"] = {**schema["properties"].get("apiVersion", {}), "const": api_version}
    schema["properties"]["kind"] = {**schema["properties"].get("kind", {}), "const": kind}
    schema["properties"]["metadata"] = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 253, "pattern": DNS_SUBDOMAIN},
            "namespace": {"type": "string"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        },
        "required": ["name"],
    }
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata"})
    source = f"{CRD_DIR}/{source_name}"
    document = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$comment": (
            f"Derived from KEDA {keda_version} (github.com/kedacore/keda), {source}, served version {version['name']}, "
            "by scripts/derive_keda_schemas.py: do not edit by hand."
        ),
        "x-metarl-source": {"keda_version": keda_version, "path": source, "crd": crd["metadata"]["name"], "version": version["name"]},
        **schema,
    }
    Draft202012Validator.check_schema(document)
    return f"keda-{kind.lower()}-{version['name']}.json", json.dumps(document, indent=1, sort_keys=True) + "\n"


def read_inputs(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(file name, text) of each CRD: the paths given, or the default CRDs read from a KEDA git dir at the version's tag."""
    if args.git_dir is None:
        return [(path.name, path.read_text(encoding="utf-8")) for path in args.crd]
    texts = []
    for name in [path.name for path in args.crd] or DEFAULT_CRDS:
        shown = subprocess.run(["git", "-C", str(args.git_dir), "show", f"{args.keda_version}:{CRD_DIR}/{name}"], capture_output=True, text=True)
        if shown.returncode != 0:
            raise DeriveError(f"git show {args.keda_version}:{CRD_DIR}/{name} in {args.git_dir}: {shown.stderr.strip()}")
        texts.append((name, shown.stdout))
    return texts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("crd", nargs="*", type=Path, help="CRD YAML files (with --git-dir: only their names, read at the tag)")
    parser.add_argument("--keda-version", required=True, help="the KEDA release tag the CRDs come from, e.g. v2.20.2")
    parser.add_argument("--git-dir", type=Path, default=None, help="a KEDA git directory to read the CRDs from (git show <tag>:config/crd/bases/...)")
    parser.add_argument("--output-dir", type=Path, default=OUTPUT_DIR, help="where the schema files go")
    parser.add_argument("--check", action="store_true", help="compare with the files instead of writing them")
    args = parser.parse_args(argv)
    if not args.crd and args.git_dir is None:
        parser.error("give CRD files or --git-dir")
    try:
        derived = [derive(text, name, args.keda_version) for name, text in read_inputs(args)]
    except (DeriveError, OSError, KeyError, yaml.YAMLError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    differs = 0
    for name, text in derived:
        target = args.output_dir / name
        if args.check:
            same = target.is_file() and target.read_text(encoding="utf-8") == text
            differs += not same
            print(f"{target}: {'up to date' if same else 'DIFFERS from the derived schema'}")
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
            print(f"wrote {target} ({len(text)} bytes)")
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
