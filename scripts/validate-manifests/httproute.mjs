// Validates HTTPRoute documents (gateway.networking.k8s.io/v1) for validate.py: reads
// [{id, doc}] as JSON on stdin, prints {id: [errors]}. Two checks, both from the npm package
// @kubernetes-models/gateway-api (generated from the Gateway API's Go types):
// - its compiled JSON schema (types, required fields, enums, patterns, limits), which allows
//   unknown fields as the CRD does (the API server prunes them);
// - its TypeScript types, through the TypeScript compiler: every document becomes an object
//   literal typed IHTTPRoute, and the excess-property check refuses any field the type lacks,
//   as `kubectl apply --validate=strict` would.
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import path from "node:path";
import ts from "typescript";
import { HTTPRoute } from "@kubernetes-models/gateway-api/gateway.networking.k8s.io/v1/HTTPRoute";

const items = JSON.parse(readFileSync(0, "utf8"));
const errors = Object.fromEntries(items.map((i) => [i.id, []]));

for (const { id, doc } of items) {
  try {
    new HTTPRoute(doc).validate();
  } catch (e) {
    errors[id].push(`Gateway API schema: ${e.message}`);
  }
}

// One in-memory source file next to node_modules (so the package's types resolve), one
// constant per document; diagnostics map back to documents by line.
const here = path.dirname(fileURLToPath(import.meta.url));
const file = path.join(here, "httproute-check.ts");
let source = 'import type { IHTTPRoute } from "@kubernetes-models/gateway-api/gateway.networking.k8s.io/v1/HTTPRoute";\n';
const starts = [];
items.forEach(({ doc }, n) => {
  starts.push(source.split("\n").length - 1);
  source += `export const doc${n}: IHTTPRoute = ${JSON.stringify(doc, null, 2)};\n`;
});
const options = {
  noEmit: true,
  strict: true,
  skipLibCheck: true,
  types: [],
  module: ts.ModuleKind.NodeNext,
  moduleResolution: ts.ModuleResolutionKind.NodeNext,
  target: ts.ScriptTarget.ES2022,
};
const host = ts.createCompilerHost(options);
const getSourceFile = host.getSourceFile.bind(host);
host.getSourceFile = (name, version, ...rest) =>
  name === file ? ts.createSourceFile(name, source, version) : getSourceFile(name, version, ...rest);
const fileExists = host.fileExists.bind(host);
host.fileExists = (name) => name === file || fileExists(name);
const readFile = host.readFile.bind(host);
host.readFile = (name) => (name === file ? source : readFile(name));
const program = ts.createProgram([file], options, host);
for (const d of ts.getPreEmitDiagnostics(program)) {
  const text = ts.flattenDiagnosticMessageText(d.messageText, " ");
  if (d.file?.fileName !== file) {
    throw new Error(`TypeScript: ${text}`);
  }
  const { line } = d.file.getLineAndCharacterOfPosition(d.start);
  const n = starts.findLastIndex((s) => s <= line);
  if (n < 0) {
    throw new Error(`TypeScript: ${text}`);
  }
  errors[items[n].id].push(`Gateway API types: ${text}`);
}
process.stdout.write(JSON.stringify(errors));
