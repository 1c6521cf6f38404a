"""Offline renderer for the railyard Helm chart (deploy/helm/railyard).

Helm is not packaged for Debian 12, so the tests render the chart with this renderer instead. It
implements exactly the Go-template and Sprig subset the chart uses, with Helm's semantics:

  actions       {{ pipeline }}, {{- trim -}} markers, {{/* comments */}}
  control       define, if / else / end, range (lists and maps; dot is the element, $ the
                root), range $v := X and range $k, $v := X (maps in sorted key order)
  operands      . .Values.a.b $ $.Values.a $var $var.a "strings" integers true false (pipeline)
  functions     include printf trunc trimSuffix hasPrefix contains default quote toYaml toJson
                nindent indent add eq not or fail kindIs int64

Numbers follow Helm: every number of values.yaml and of user values files is a float64 (Helm
decodes values through JSON), printed the way Go's fmt prints a float64, so that 1000000 renders
as 1e+06 here exactly as it does with Helm (templates must convert with int64). Integer literals
of the templates stay integers; eq of a float64 and an integer is an error, as in Go.

Anything else (with, else if, variable assignment, unknown functions, a missing value that is
printed) is an error, never a silent empty string: a chart change that needs more must extend
this file and its tests, so that what the tests validate is what Helm would render.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Dict, List, Optional, Tuple

import yaml

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.DOTALL)


class TemplateError(Exception):
    pass


class ChartFailure(TemplateError):
    """The chart's own `fail`: Helm stops with this message (a refused combination of values)."""


@dataclass
class _Node:
    kind: str  # text, action, if, range, define
    text: str = ""
    pipeline: str = ""
    body: List["_Node"] = field(default_factory=list)
    orelse: List["_Node"] = field(default_factory=list)
    variables: List[str] = field(default_factory=list)  # range $k, $v := ...: ["k", "v"]


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
            if word == "range" and rest.startswith("$"):
                m = _RANGE_VARS.fullmatch(rest)
                if not m:
                    raise TemplateError(f"{name}: cannot parse 'range {rest}'")
                node.variables = [v for v in (m.group(1), m.group(2)) if v]
                node.pipeline = m.group(3)
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


_RANGE_VARS = re.compile(r"\$(\w+)(?:\s*,\s*\$(\w+))?\s*:=\s*(\S.*)", re.DOTALL)


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


def go_float(v: float) -> str:
    """fmt's %v of a float64: the shortest digits that round-trip, in %e form when the decimal
    exponent is < -4 or >= 6 (strconv's 'g' with the shortest precision), else in %f form."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == 0:
        return "-0" if math.copysign(1.0, v) < 0 else "0"
    sign = "-" if v < 0 else ""
    # Python's repr is also the shortest string that round-trips.
    t = Decimal(repr(abs(v))).normalize().as_tuple()
    digits = "".join(str(d) for d in t.digits)
    point = len(digits) + t.exponent  # v = 0.<digits> * 10**point
    exp = point - 1
    if exp < -4 or exp >= 6:
        tail = ("." + digits[1:]) if len(digits) > 1 else ""
        return f"{sign}{digits[0]}{tail}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{sign}{digits}{'0' * (point - len(digits))}"
    return f"{sign}{digits[:point]}.{digits[point:]}"


def go_string(v: Any) -> str:
    """How a Go template prints a value (fmt %v of Helm's decoded YAML)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return go_float(v)
    if isinstance(v, str):
        return v
    raise TemplateError(f"cannot print {type(v).__name__} {v!r} (missing value or a map/list)")


def _as_helm_values(v: Any) -> Any:
    """Values as Helm holds them: every number a float64."""
    if isinstance(v, dict):
        return {k: _as_helm_values(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_as_helm_values(x) for x in v]
    if isinstance(v, int) and not isinstance(v, bool):
        return float(v)
    return v


def _for_marshal(v: Any) -> Any:
    """What Go's JSON/YAML marshalling prints: a float64 with an integral value below 1e21 as
    an integer (400, not 400.0)."""
    if isinstance(v, dict):
        return {k: _for_marshal(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_for_marshal(x) for x in v]
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e21:
        return int(v)
    return v


def _to_yaml(v: Any) -> str:
    # Helm: sigs.k8s.io/yaml (sorted keys, block style), trailing newline trimmed.
    v = _for_marshal(v)
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
        merged = _as_helm_values(_merge(self.values, values or {}))
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
    """Helm's values merge: maps merge recursively, null deletes a key, anything else replaces."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for k, v in override.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = _merge(base.get(k), v) if k in base else v
        return out
    return override


class _Renderer:
    def __init__(self, chart: Chart, root: Dict[str, Any]):
        self.chart = chart
        self.root = root

    def run(self, nodes: List[_Node], dot: Any, where: str,
            scope: Optional[Dict[str, Any]] = None) -> str:
        """Renders nodes with dot and the variables in scope (a template starts with none)."""
        scope = scope or {}
        out: List[str] = []
        for n in nodes:
            if n.kind == "text":
                out.append(n.text)
            elif n.kind == "action":
                out.append(go_string(self.pipeline(n.pipeline, dot, where, scope)))
            elif n.kind == "if":
                cond = _truthy(self.pipeline(n.pipeline, dot, where, scope))
                out.append(self.run(n.body if cond else n.orelse, dot, where, scope))
            elif n.kind == "range":
                seq = self.pipeline(n.pipeline, dot, where, scope)
                if seq is None:
                    seq = []
                if isinstance(seq, dict):
                    pairs = [(k, seq[k]) for k in sorted(seq)]  # Go: maps in key order
                elif isinstance(seq, list):
                    pairs = list(enumerate(seq))
                else:
                    raise TemplateError(f"{where}: range over {type(seq).__name__}")
                for key, item in pairs:
                    inner = dict(scope)
                    if len(n.variables) == 1:
                        inner[n.variables[0]] = item
                    elif len(n.variables) == 2:
                        inner[n.variables[0]], inner[n.variables[1]] = key, item
                    out.append(self.run(n.body, item, where, inner))
        return "".join(out)

    def pipeline(self, text: str, dot: Any, where: str, scope: Dict[str, Any]) -> Any:
        value: Any = _NOTHING
        for command in _split_top(text, "|"):
            value = self.command(command, dot, where, value, scope)
        return value

    def command(self, text: str, dot: Any, where: str, piped: Any,
                scope: Dict[str, Any]) -> Any:
        words = _split_top(text, " ")
        head = words[0]
        if head in _FUNCS or head == "include":
            args = [self.operand(w, dot, where, scope) for w in words[1:]]
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
        return self.operand(head, dot, where, scope)

    def operand(self, word: str, dot: Any, where: str, scope: Dict[str, Any]) -> Any:
        if word.startswith("(") and word.endswith(")"):
            return self.pipeline(word[1:-1], dot, where, scope)
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
        m = re.fullmatch(r"\$(\w+)((?:\.\w+)*)", word)
        if m:
            if m.group(1) not in scope:
                raise TemplateError(f"{where}: undefined variable ${m.group(1)}")
            value = scope[m.group(1)]
            return _lookup(value, m.group(2)[1:], where) if m.group(2) else value
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
        verb = m.group(0)
        if verb == "%%":
            return "%"
        v = next(it)
        # Go prints %!s(float64=1) / %!d(string=x) for a mismatched verb: never what a chart wants.
        if (verb == "%s" and not isinstance(v, str)) or \
                (verb == "%d" and (not isinstance(v, int) or isinstance(v, bool))):
            raise TemplateError(f"printf {verb} of {type(v).__name__} {v!r}")
        return go_string(v)

    return re.sub(r"%[svd%]", sub, fmt)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _eq(a: Any, b: Any) -> bool:
    if _is_number(a) and _is_number(b) and isinstance(a, float) != isinstance(b, float):
        # text/template: "incompatible types for comparison" (float64 value, int literal).
        raise TemplateError(f"eq of {type(a).__name__} {a!r} and {type(b).__name__} {b!r}")
    return a == b


def _or(*args: Any) -> Any:
    # text/template: the first non-empty argument, else the last.
    for a in args:
        if _truthy(a):
            return a
    return args[-1]


def _fail(message: str) -> Any:
    raise ChartFailure(message)


def _kind(v: Any) -> str:
    """reflect.Kind of a Helm value: values' numbers are float64, template literals int."""
    if v is None:
        return "invalid"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    for t, kind in ((float, "float64"), (str, "string"), (dict, "map"), (list, "slice")):
        if isinstance(v, t):
            return kind
    raise TemplateError(f"no Go kind for {type(v).__name__}")


def _int64(v: Any) -> int:
    # Sprig's int64 (cast.ToInt64): numbers truncate, booleans are 0/1, nil is 0. Strings are
    # parsed by Go rules and silently 0 when they do not parse: not modelled, refused instead.
    if v is None:
        return 0
    if isinstance(v, (bool, int, float)):
        return int(v)
    raise TemplateError(f"int64 of {type(v).__name__} {v!r} is not modelled")


_FUNCS = {
    "printf": _printf,
    "trunc": lambda n, s: s[:n] if n >= 0 else s[n:],
    "trimSuffix": lambda suffix, s: s[:-len(suffix)] if suffix and s.endswith(suffix) else s,
    "contains": lambda sub, s: sub in s,
    "hasPrefix": lambda prefix, s: s.startswith(prefix),
    "default": lambda d, v=None: v if _truthy(v) else d,
    "quote": _quote,
    "toYaml": _to_yaml,
    "toJson": lambda v: json.dumps(_for_marshal(v), separators=(",", ":"), sort_keys=True),
    "nindent": lambda n, s: "\n" + _indent(n, s),
    "indent": _indent,
    "add": lambda *xs: sum(int(x) for x in xs),
    "eq": _eq,
    "not": lambda v: not _truthy(v),
    "or": _or,
    "fail": _fail,
    "kindIs": lambda kind, v: _kind(v) == kind,
    "int64": _int64,
}
