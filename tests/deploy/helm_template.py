"""Offline renderer for the railyard Helm chart (deploy/helm/railyard).

Helm is not packaged for Debian 12, so the tests render the chart with this renderer instead. It
implements exactly the Go-template and Sprig subset the chart uses, with Helm's semantics:

  actions       {{ pipeline }}, {{- trim -}} markers, {{/* comments */}}
  control       define, if / else / end, range (lists; dot is the element, $ the root)
  operands      . .Values.a.b $ $.Values.a "strings" integers true false (pipeline)
  functions     include printf trunc trimSuffix contains default quote toYaml toJson nindent
                indent add eq not

Anything else (with, else if, variables other than $, unknown functions, a missing value that is
printed) is an error, never a silent empty string: a chart change that needs more must extend
this file and its tests, so that what the tests validate is what Helm would render.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import yaml

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.DOTALL)


class TemplateError(Exception):
    pass


@dataclass
class _Node:
    kind: str  # text, action, if, range, define
    text: str = ""
    pipeline: str = ""
    body: List["_Node"] = field(default_factory=list)
    orelse: List["_Node"] = field(default_factory=list)


def _lex(source: str, name: str) -> List[Tuple[str, str]]:
    """Splits a template into ("text", s) and ("action", body) items, applying trim markers."""
    items: List[Tuple[str, str]] = []
    pos = 0
    trim_next = False
    for m in _ACTION.finditer(source):
        text = source[pos:m.start()]
        if trim_next:
            text = text.lstrip()
        if m.group(1):
            text = text.rstrip()
        if text:
            items.append(("text", text))
        body = m.group(2).strip()
        if not (body.startswith("/*") and body.endswith("*/")):
            items.append(("action", body))
        trim_next = bool(m.group(3))
        pos = m.end()
    tail = source[pos:]
    if trim_next:
        tail = tail.lstrip()
    if "{{" in tail or "}}" in tail:
        raise TemplateError(f"{name}: unbalanced '{{{{' or '}}}}' near {tail[:40]!r}")
    if tail:
        items.append(("text", tail))
    return items


def _parse(items: List[Tuple[str, str]], name: str) -> Tuple[List[_Node], Dict[str, List[_Node]]]:
    """Builds the node tree; returns (top-level nodes, defined templates)."""
    defines: Dict[str, List[_Node]] = {}
    root: List[_Node] = []
    stack: List[Tuple[_Node, List[_Node]]] = []  # (open block, list being filled)
    current = root
    for kind, value in items:
        if kind == "text":
            current.append(_Node("text", text=value))
            continue
        word, _, rest = value.partition(" ")
        rest = rest.strip()
        if word == "define":
            node = _Node("define", pipeline=_string_literal(rest, name))
            stack.append((node, current))
            current = node.body
        elif word in ("if", "range"):
            if not rest:
                raise TemplateError(f"{name}: '{word}' without a pipeline")
            node = _Node(word, pipeline=rest)
            current.append(node)
            stack.append((node, current))
            current = node.body
        elif word == "else":
            if rest:
                raise TemplateError(f"{name}: 'else {rest}' is not supported")
            if not stack or stack[-1][0].kind != "if" or current is stack[-1][0].orelse:
                raise TemplateError(f"{name}: 'else' outside an if")
            current = stack[-1][0].orelse
        elif word == "end":
            if not stack:
                raise TemplateError(f"{name}: 'end' without a block")
            node, parent = stack.pop()
            if node.kind == "define":
                defines[node.pipeline] = node.body
            current = parent
        elif word in ("with", "template", "block", "break", "continue") or value.startswith("$") \
                and ":=" in value:
            raise TemplateError(f"{name}: '{word}' is not supported by this renderer")
        else:
            current.append(_Node("action", pipeline=value))
    if stack:
        raise TemplateError(f"{name}: '{stack[-1][0].kind}' block not closed")
    return root, defines


def _string_literal(token: str, where: str) -> str:
    if len(token) < 2 or token[0] != '"' or token[-1] != '"':
        raise TemplateError(f"{where}: expected a string literal, got {token!r}")
    return json.loads(token)


def _split_top(text: str, sep: str) -> List[str]:
    """Splits on sep outside string literals and parentheses."""
    parts, depth, quote, start = [], 0, False, 0
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == '"':
                quote = False
        elif c == '"':
            quote = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif depth == 0 and (c == sep or (sep == " " and c.isspace())):
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _truthy(v: Any) -> bool:
    # Go templates: false, 0, nil and empty strings, lists and maps are false.
    return bool(v)


def go_string(v: Any) -> str:
    """How a Go template prints a value (fmt %v of Helm's decoded YAML)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() else repr(v)
    if isinstance(v, str):
        return v
    raise TemplateError(f"cannot print {type(v).__name__} {v!r} (missing value or a map/list)")


def _to_yaml(v: Any) -> str:
    # Helm: sigs.k8s.io/yaml (sorted keys, block style), trailing newline trimmed.
    return yaml.safe_dump(v, default_flow_style=False, sort_keys=True).rstrip("\n") \
        if v not in (None, {}, []) else ("{}" if v == {} else "[]" if v == [] else "null")


def _indent(n: int, s: str) -> str:
    pad = " " * int(n)
    return pad + s.replace("\n", "\n" + pad)


class Chart:
    """A chart directory: Chart.yaml, values.yaml, templates/*.yaml|tpl|txt."""

    def __init__(self, path: str):
        self.path = path
        with open(os.path.join(path, "Chart.yaml")) as f:
            self.meta = yaml.safe_load(f)
        with open(os.path.join(path, "values.yaml")) as f:
            self.values = yaml.safe_load(f) or {}
        self.templates: Dict[str, List[_Node]] = {}
        self.defines: Dict[str, List[_Node]] = {}
        tdir = os.path.join(path, "templates")
        for fname in sorted(os.listdir(tdir)):
            with open(os.path.join(tdir, fname)) as f:
                nodes, defines = _parse(_lex(f.read(), fname), fname)
            for k, v in defines.items():
                if k in self.defines:
                    raise TemplateError(f"{fname}: template {k!r} defined twice")
                self.defines[k] = v
            if not fname.startswith("_"):
                self.templates[fname] = nodes

    def render(self, release: str = "railyard", namespace: str = "railyard",
               values: Optional[Dict[str, Any]] = None) -> Dict[str, str]:
        """Renders every template (not partials) like `helm template`; returns name -> text."""
        merged = _merge(self.values, values or {})
        root = {
            "Values": merged,
            "Release": {"Name": release, "Namespace": namespace, "Service": "Helm",
                        "IsInstall": True, "IsUpgrade": False},
            "Chart": {"Name": self.meta["name"], "Version": self.meta["version"],
                      "AppVersion": self.meta.get("appVersion", "")},
        }
        return {name: _Renderer(self, root).run(nodes, root, name)
                for name, nodes in self.templates.items()}

    def render_objects(self, **kwargs) -> List[Dict[str, Any]]:
        """The Kubernetes objects of the rendered YAML templates (NOTES.txt excluded)."""
        objects = []
        for name, text in self.render(**kwargs).items():
            if not name.endswith(".yaml"):
                continue
            try:
                docs = list(yaml.safe_load_all(text))
            except yaml.YAMLError as e:
                raise TemplateError(f"{name} renders invalid YAML: {e}\n{text}") from e
            objects.extend(d for d in docs if d is not None)
        return objects


def _merge(base: Any, override: Any) -> Any:
    """Helm's values merge: maps merge recursively, anything else replaces."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for k, v in override.items():
            out[k] = _merge(base.get(k), v) if k in base else v
        return out
    return override


class _Renderer:
    def __init__(self, chart: Chart, root: Dict[str, Any]):
        self.chart = chart
        self.root = root

    def run(self, nodes: List[_Node], dot: Any, where: str) -> str:
        out: List[str] = []
        for n in nodes:
            if n.kind == "text":
                out.append(n.text)
            elif n.kind == "action":
                out.append(go_string(self.pipeline(n.pipeline, dot, where)))
            elif n.kind == "if":
                branch = n.body if _truthy(self.pipeline(n.pipeline, dot, where)) else n.orelse
                out.append(self.run(branch, dot, where))
            elif n.kind == "range":
                seq = self.pipeline(n.pipeline, dot, where)
                if isinstance(seq, dict):
                    seq = [seq[k] for k in sorted(seq)]
                if seq is None:
                    seq = []
                if not isinstance(seq, list):
                    raise TemplateError(f"{where}: range over {type(seq).__name__}")
                out.extend(self.run(n.body, item, where) for item in seq)
        return "".join(out)

    def pipeline(self, text: str, dot: Any, where: str) -> Any:
        value: Any = _NOTHING
        for command in _split_top(text, "|"):
            value = self.command(command, dot, where, value)
        return value

    def command(self, text: str, dot: Any, where: str, piped: Any) -> Any:
        words = _split_top(text, " ")
        head = words[0]
        if head in _FUNCS or head == "include":
            args = [self.operand(w, dot, where) for w in words[1:]]
            if piped is not _NOTHING:
                args.append(piped)
            if head == "include":
                if len(args) != 2:
                    raise TemplateError(f"{where}: include takes a name and a context")
                body = self.chart.defines.get(args[0])
                if body is None:
                    raise TemplateError(f"{where}: no template {args[0]!r}")
                return self.run(body, args[1], f"{where} > {args[0]}")
            try:
                return _FUNCS[head](*args)
            except TypeError as e:
                raise TemplateError(f"{where}: {head}: {e}") from e
        if len(words) != 1 or piped is not _NOTHING:
            raise TemplateError(f"{where}: {head!r} is not a function this renderer knows")
        return self.operand(head, dot, where)

    def operand(self, word: str, dot: Any, where: str) -> Any:
        if word.startswith("(") and word.endswith(")"):
            return self.pipeline(word[1:-1], dot, where)
        if word.startswith('"'):
            return _string_literal(word, where)
        if re.fullmatch(r"-?\d+", word):
            return int(word)
        if word in ("true", "false"):
            return word == "true"
        if word == ".":
            return dot
        if word == "$":
            return self.root
        if word.startswith("$."):
            return _lookup(self.root, word[2:], where)
        if word.startswith("."):
            return _lookup(dot, word[1:], where)
        raise TemplateError(f"{where}: cannot evaluate {word!r}")


_NOTHING = object()


def _lookup(value: Any, path: str, where: str) -> Any:
    for key in path.split("."):
        if not isinstance(value, dict):
            raise TemplateError(f"{where}: .{path}: {key!r} of a {type(value).__name__}")
        value = value.get(key)  # a missing key is nil, as in Helm; printing nil is an error
    return value


def _quote(*vs: Any) -> str:
    return " ".join(json.dumps(go_string(v)) for v in vs if v is not None)


def _printf(fmt: str, *args: Any) -> str:
    it = iter(args)

    def sub(m: re.Match) -> str:
        if m.group(0) == "%%":
            return "%"
        return go_string(next(it))

    return re.sub(r"%[svd%]", sub, fmt)


_FUNCS = {
    "printf": _printf,
    "trunc": lambda n, s: s[:n] if n >= 0 else s[n:],
    "trimSuffix": lambda suffix, s: s[:-len(suffix)] if suffix and s.endswith(suffix) else s,
    "contains": lambda sub, s: sub in s,
    "default": lambda d, v=None: v if _truthy(v) else d,
    "quote": _quote,
    "toYaml": _to_yaml,
    "toJson": lambda v: json.dumps(v, separators=(",", ":"), sort_keys=True),
    "nindent": lambda n, s: "\n" + _indent(n, s),
    "indent": _indent,
    "add": lambda *xs: sum(int(x) for x in xs),
    "eq": lambda a, b: a == b,
    "not": lambda v: not _truthy(v),
}
