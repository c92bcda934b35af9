#!/usr/bin/env python3
"""Validates every document of the given Kubernetes manifests offline, by kind; run it through
scripts/validate-manifests.sh, which makes its environment.

- Kubernetes' own kinds: the strict JSON schemas (unknown fields refused) that the PyPI package
  kubernetes-validate bundles, for each Kubernetes version asked for.
- InferencePool (inference.networking.k8s.io/v1): deploy/kubernetes/schemas/inferencepool-v1.json,
  written for kvgate from the extension's API reference; with --crd FILE also the v1
  openAPIV3Schema of a real InferencePool CRD, its objects closed as strict field validation
  treats them (its CEL rules are not evaluated).
- HTTPRoute (gateway.networking.k8s.io/v1): the Gateway API schema compiled into the npm
  package @kubernetes-models/gateway-api, and its TypeScript types through the TypeScript
  compiler, whose excess-property check is what refuses unknown fields (the schema allows them).
- The metadata of those two: Kubernetes' ObjectMeta schema, strict.
- Any other kind: an error (no schema, no pass).

--self-test breaks the manifests in ways a reviewer could miss (a misspelled field, a value out
of its enum or range, an unknown kind) and fails unless every broken document is refused.
"""

import argparse
import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import referencing
import yaml
from kubernetes_validate import utils as kv

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
POOL_SCHEMA = ROOT / "deploy/kubernetes/schemas/inferencepool-v1.json"
POOL = ("inference.networking.k8s.io/v1", "InferencePool")
ROUTE = ("gateway.networking.k8s.io/v1", "HTTPRoute")


def documents(path):
    """(first line, document) for each non-empty YAML document of the file."""
    text = Path(path).read_text()
    loader = yaml.SafeLoader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            data = loader.construct_document(node)
            if data:
                yield node.start_mark.line + 1, data
    finally:
        loader.dispose()


def where(error, root=""):
    """An error's place in the document, as `spec.ports[0].name`."""
    out = root
    for part in error.absolute_path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(document)"


def messages(validator, data, prefix="", root=""):
    errors = sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{prefix}{where(e, root)}: {e.message}" for e in errors]


class Kubernetes:
    """Validators over kubernetes-validate's strict schemas, one set per Kubernetes version."""

    def __init__(self, versions):
        self.versions = []
        for wanted in versions:
            bundled = [v for v in kv.all_versions() if kv.major_minor(v) <= kv.major_minor(wanted)]
            if kv.major_minor(wanted) > kv.major_minor(kv.latest_version()) or not bundled:
                sys.exit(f"kubernetes-validate bundles {kv.all_versions()}, not {wanted}")
            self.versions.append(bundled[-1])
        self.cache = {}

    def validator(self, version, name):
        key = (version, name)
        if key not in self.cache:
            folder = f"kubernetes-json-schema/v{version}-local-strict"
            try:
                schema = kv.schema_contents(f"{folder}/{name}.json", version)
            except FileNotFoundError:
                self.cache[key] = None
                return None
            definitions = kv.schema_contents(f"{folder}/_definitions.json", version)
            registry = referencing.Resource.from_contents(schema) @ referencing.Registry()
            registry = referencing.Resource.from_contents(definitions) @ registry
            self.cache[key] = jsonschema.Draft202012Validator(schema, registry=registry)
        return self.cache[key]

    def check(self, data, name, root=""):
        """Errors of `data` (at `root` in its document) against the schema file `name` in every
        version; None: no schema."""
        errors = []
        for version in self.versions:
            validator = self.validator(version, name)
            if validator is None:
                return None
            errors += messages(validator, data, f"Kubernetes {kv.major_minor(version)}: ", root)
        return errors

    def kind(self, doc):
        api = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", str(doc.get("apiVersion", "")))
        errors = self.check(doc, f"{str(doc.get('kind', '')).lower()}-{api}")
        if errors is None:
            return [f"no schema for kind {doc.get('kind')!r} of {doc.get('apiVersion')!r}: "
                    "not validated, so refused"]
        return errors

    def metadata(self, doc):
        return self.check(doc.get("metadata") or {}, "objectmeta-meta-v1", "metadata") or []


def closed(schema):
    """A CRD's openAPIV3Schema with every object closed, as strict field validation treats
    unknown fields (the API server prunes them otherwise)."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed(v) for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def crd_validator(path):
    for crd in (d for _, d in documents(path)):
        if crd.get("kind") != "CustomResourceDefinition":
            continue
        names = crd["spec"]["names"]
        if crd["spec"]["group"] != POOL[0].split("/")[0] or names["kind"] != POOL[1]:
            continue
        for version in crd["spec"]["versions"]:
            if version["name"] == POOL[0].split("/")[1]:
                schema = closed(version["schema"]["openAPIV3Schema"])
                return jsonschema.Draft7Validator(schema)
    sys.exit(f"{path}: no {POOL[1]} CRD with version {POOL[0]}")


def routes(items):
    """Errors per id of HTTPRoute documents, from httproute.mjs (one Node process for all)."""
    if not items:
        return {}
    run = subprocess.run(["node", str(HERE / "httproute.mjs")], input=json.dumps(items),
                         capture_output=True, text=True, check=False)
    if run.returncode != 0:
        sys.exit(f"httproute.mjs failed:\n{run.stderr}")
    return json.loads(run.stdout)


def validate(docs, k8s, crd):
    """{id: [errors]} for [(id, document)]."""
    pool = jsonschema.Draft202012Validator(json.loads(POOL_SCHEMA.read_text()))
    errors, route_items = {}, []
    for ident, doc in docs:
        kind = (doc.get("apiVersion"), doc.get("kind"))
        if kind == POOL:
            errors[ident] = messages(pool, doc, "kvgate's InferencePool schema: ")
            if crd is not None:
                errors[ident] += messages(crd, doc, "the CRD: ")
            errors[ident] += k8s.metadata(doc)
        elif kind == ROUTE:
            errors[ident] = k8s.metadata(doc)
            route_items.append({"id": ident, "doc": doc})
        else:
            errors[ident] = k8s.kind(doc)
    for ident, found in routes(route_items).items():
        errors[ident] += found
    return errors


def parent(doc, path):
    """The node holding the last key of `path`, and that key."""
    *parents, last = path
    node = doc
    for p in parents:
        node = node[p]
    return node, last


def rename(path, new):
    def apply(doc):
        node, last = parent(doc, path)
        node[new] = node.pop(last)
    return apply


def assign(path, value):
    def apply(doc):
        node, last = parent(doc, path)
        node[last] = value
    return apply


CONTAINER = ["spec", "template", "spec", "containers", 0]
# (kind, name, what is broken, how): each must be refused.
BREAKAGES = [
    ("Deployment", "kvgate-gateway", "misspelled readinessProbe",
     rename(CONTAINER + ["readinessProbe"], "readinesProbe")),
    ("Deployment", "kvgate-epp", "misspelled readOnlyRootFilesystem",
     rename(CONTAINER + ["securityContext", "readOnlyRootFilesystem"], "readOnlyRootFileSystem")),
    ("Deployment", "kvgate-gateway", "a port number as a string",
     assign(CONTAINER + ["ports", 0, "containerPort"], "8080")),
    ("Service", "kvgate-epp", "misspelled targetPort", rename(["spec", "ports", 0, "targetPort"], "tagetPort")),
    ("ConfigMap", "kvgate-gateway", "misspelled data", rename(["data"], "date")),
    ("Role", "kvgate-epp", "misspelled verbs", rename(["rules", 0, "verbs"], "verb")),
    ("RoleBinding", "kvgate-epp", "misspelled roleRef", rename(["roleRef"], "roleref")),
    ("ServiceAccount", "kvgate-epp", "an unknown kind", assign(["kind"], "ServiceAcount")),
    ("InferencePool", "llama-pool", "misspelled endpointPickerRef",
     rename(["spec", "endpointPickerRef"], "endpointPickerRefs")),
    ("InferencePool", "llama-pool", "misspelled targetPorts' number",
     rename(["spec", "targetPorts", 0, "number"], "port")),
    ("InferencePool", "llama-pool", "a failureMode out of its enum",
     assign(["spec", "endpointPickerRef", "failureMode"], "FailOpened")),
    ("InferencePool", "llama-pool", "a target port out of range",
     assign(["spec", "targetPorts", 0, "number"], 70000)),
    ("InferencePool", "llama-pool", "misspelled metadata.labels", rename(["metadata", "labels"], "lables")),
    ("HTTPRoute", "llama-route", "misspelled backendRefs",
     rename(["spec", "rules", 0, "backendRefs"], "backendRef")),
    ("HTTPRoute", "llama-route", "misspelled parentRefs' name",
     rename(["spec", "parentRefs", 0, "name"], "nmae")),
    ("HTTPRoute", "llama-route", "a path match type out of its enum",
     assign(["spec", "rules", 0, "matches", 0, "path", "type"], "Prefix")),
]


def broken(docs):
    """[(id, broken document)] from BREAKAGES, each applied to its own copy; exits if one has
    nothing to break (the manifests changed: BREAKAGES must follow)."""
    out = []
    for kind, name, what, apply in BREAKAGES:
        found = [d for _, d in docs if d.get("kind") == kind and d["metadata"]["name"] == name]
        doc = copy.deepcopy(found[0]) if found else None
        try:
            apply(doc)
        except (KeyError, IndexError, TypeError):
            sys.exit(f"self-test: cannot break {kind} {name} ({what}): not in the manifests "
                     "as BREAKAGES expects")
        out.append((f"self-test: {kind} {name} with {what}", doc))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--kubernetes", default="1.31.0,1.37.0",
                        help="Kubernetes versions to validate against, comma-separated")
    parser.add_argument("--crd", help="an InferencePool CRD (YAML) to validate against too")
    parser.add_argument("--self-test", action="store_true",
                        help="also check that broken copies of kvgate's manifests are refused")
    args = parser.parse_args()
    k8s = Kubernetes(args.kubernetes.split(","))
    crd = crd_validator(args.crd) if args.crd else None
    docs = []
    for path in args.files:
        for line, doc in documents(path):
            name = (doc.get("metadata") or {}).get("name", "?")
            shown = Path(path).resolve()
            shown = shown.relative_to(ROOT) if shown.is_relative_to(ROOT) else shown
            docs.append((f"{shown}:{line} {doc.get('kind')} {name}", doc))
    tests = broken(docs) if args.self_test else []
    errors = validate(docs + tests, k8s, crd)
    failed = 0
    for ident, _ in docs:
        if errors[ident]:
            failed += 1
            print(f"FAIL {ident}")
            for e in errors[ident]:
                print(f"    {e}")
        else:
            print(f"ok   {ident}")
    against = ", ".join(kv.major_minor(v) for v in k8s.versions)
    print(f"{len(docs) - failed} passed, {failed} failed (Kubernetes {against}"
          f"{', InferencePool CRD ' + args.crd if crd else ''})")
    missed = [i for i, _ in tests if not errors[i]]
    if tests:
        for ident, _ in tests:
            first = errors[ident][0] if errors[ident] else "ACCEPTED"
            print(f"{'refused' if errors[ident] else 'MISSED '} {ident}: {first}")
        print(f"self-test: {len(tests) - len(missed)} of {len(tests)} broken documents refused")
    return 1 if failed or missed else 0


if __name__ == "__main__":
    sys.exit(main())
