"""Argo's expression language: ``{{=...}}`` tags, ``valueFrom.expression``, ``fromExpression``.

Argo evaluates these with expr-lang (github.com/expr-lang/expr) against
``env.GetFuncMap(scope)`` (util/expr/env/env.go): the scope's dotted names expanded into nested
maps (util/expand/expand.go; a name that is also another's prefix is dropped), plus ``asInt``
(expr's ``int``), ``asFloat`` (``float``), ``jsonpath``, ``toJson`` and ``sprig`` (sprig's
generic function map). Parameters are strings; ``asInt``/``asFloat`` convert them.

This module is imported only when a manifest uses an expression (manifest.py, substitution.py,
outputs.py import it inside functions), so a run without one never loads lark.

The grammar follows expr's parser (parser/parser.go, parser/operator/operator.go): binary
precedence ``|`` 0, ``or``/``||`` 10, ``and``/``&&`` 15, comparisons and ``in``, ``matches``,
``contains``, ``startsWith``, ``endsWith`` (each also with ``not``) 20, ``..`` 25, ``+ -`` 30,
unary ``not``/``!`` 50, ``* / %`` 60, unary ``-``/``+`` 90, ``** ^`` 100 (right), ``??`` 500;
the ternary ``c ? a : b`` (and ``a ?: b``) below them all. A unary operator takes the operand
made of operators at least as tight as itself, so ``!a * b`` is ``!(a * b)`` and ``-a ** 2`` is
``-(a ** 2)``; ``a < b < c`` is ``a < b && b < c``; ``??`` may not be followed by another
operator without parentheses. Runtime semantics are vm/runtime/runtime.go's: ``==`` across
types is false, numbers compare across int and float, ``/`` and ``**`` give floats, ``%`` takes
integers, ``+`` adds numbers or joins strings (anything else is an error), a missing map key is
nil, a member of nil is an error (``?.`` gives nil), ``and``/``or``/``!``/``?:`` need booleans.

Not supported, refused by name: ``let``, ``if {} else {}``, ``::``, and the expr builtins and
sprig functions absent from ``BUILTINS`` / ``SPRIG`` below.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from .conditions import ExpressionError
from .gojson import go_string

_GRAMMAR = r"""
?start: expr

?expr: pipe
     | pipe "?" expr ":" expr        -> ternary
     | pipe "?" ":" expr             -> elvis

?pipe: or_
     | pipe "|" NAME "(" [args] ")"  -> pipe_call

?or_: and_ | or_ ("||" | "or") and_  -> or_op
?and_: cmp | and_ ("&&" | "and") cmp -> and_op
?cmp: range_ | cmp cmp_op range_     -> compare
!cmp_op: "==" | "!=" | "<" | ">" | "<=" | ">=" | "in" | "matches" | "contains"
       | "startsWith" | "endsWith" | "not" "in" | "not" "matches" | "not" "contains"
       | "not" "startsWith" | "not" "endsWith"
?range_: add | add ".." add          -> range_op
?add: mul | add ADDOP mul            -> binop
?mul: pow_ | mul MULOP pow_          -> binop
?pow_: coal | coal POWOP pow_        -> binop
?coal: unary | coal "??" unary       -> coalesce
?unary: postfix
      | ("!" | "not") mul            -> not_op
      | ADDOP pow_                   -> sign

?postfix: primary
        | postfix "." prop           -> member
        | postfix "?." prop          -> opt_member
        | postfix "[" expr "]"       -> index
        | postfix "?." "[" expr "]"  -> opt_index
        | postfix "[" [expr] SLICE [expr] "]" -> slice
        | postfix "(" [args] ")"     -> call

?primary: NUMBER                     -> number
        | STRING                     -> string
        | "true"                     -> true
        | "false"                    -> false
        | "nil"                      -> nil
        | NAME                       -> name
        | "(" expr ")"               -> paren
        | "[" [args] "]"             -> array
        | "{" [pairs] "}"            -> map_
        | "{" expr "}"               -> closure
        | "#" [NAME]                 -> pointer
        | "." prop                   -> pointer_member

args: expr ("," expr)* [","]
pairs: pair ("," pair)* [","]
pair: (NAME | STRING | NUMBER) ":" expr
    | "(" expr ")" ":" expr
!prop: NAME | "in" | "matches" | "contains" | "startsWith" | "endsWith" | "not" | "and"
     | "or" | "true" | "false" | "nil"

ADDOP: "+" | "-"
MULOP: "*" | "/" | "%"
POWOP: "**" | "^"
SLICE: ":"
NAME: /[A-Za-z_$][A-Za-z0-9_$]*/
NUMBER: /0[xX][0-9a-fA-F_]+|0[bB][01_]+|0[oO][0-7_]+|(\d[\d_]*)?\.?\d[\d_]*([eE][+-]?\d+)?/
STRING: /"(?:[^"\\]|\\.)*"/ | /'(?:[^'\\]|\\.)*'/ | /`[^`]*`/
%ignore /\s+/
"""

_PARSER: Lark | None = None


def _parser() -> Lark:
    global _PARSER
    if _PARSER is None:
        # cache=True: lark keeps the built tables in the temp folder (by grammar hash), which
        # cuts the first parse of each run from ~55 ms to a few.
        _PARSER = Lark(_GRAMMAR, parser="lalr", maybe_placeholders=True, cache=True)
    return _PARSER


# ---------------------------------------------------------------------------------- parsing

_RELATIONAL = ("<", ">", "<=", ">=")


def parse(source: str) -> Tree:
    """The tree of an expression; ``ExpressionError`` naming what is wrong or unsupported."""
    text = source.strip()
    if not text:
        raise ExpressionError("empty expression")
    lead = re.match(r"(let|if)\b", text)
    if lead:
        raise ExpressionError(f"{lead.group(1)!r} is not supported by the local runner "
                              f"(in {source!r})")
    if "::" in _outside_strings(text):
        raise ExpressionError(f"'::' is not supported by the local runner (in {source!r})")
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as exc:
        raise ExpressionError(_syntax_error(exc, text)) from None
    if not isinstance(tree, Tree):  # a lone token cannot happen with this grammar
        raise ExpressionError(f"cannot parse {source!r}")
    _check(tree, source)
    if "jsonpath" in text:
        _check_json_paths(tree, source)
    return tree


def _outside_strings(text: str) -> str:
    return re.sub(r""""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`""", '""', text)


def _syntax_error(exc: UnexpectedInput, text: str) -> str:
    column = getattr(exc, "column", "?")
    if isinstance(exc, UnexpectedEOF):
        return f"unexpected end of expression {text!r}"
    if isinstance(exc, UnexpectedToken):
        token = exc.token
        if token.type == "$END":
            return f"unexpected end of expression {text!r}"
        return f"unexpected token {str(token)!r} at column {column} in expression {text!r}"
    if isinstance(exc, UnexpectedCharacters):
        return f"unexpected character {exc.char!r} at column {column} in expression {text!r}"
    return f"cannot parse expression {text!r}"


_BINARY_KINDS = ("or_op", "and_op", "compare", "range_op", "binop", "pipe_call")


def _check(tree: Tree, source: str) -> None:
    """What expr's parser refuses that the grammar accepts, and every function named."""
    for node in tree.iter_subtrees_topdown():
        if node.data == "call":
            _check_callee(node.children[0], source)
        if node.data == "pipe_call":
            _check_function(str(node.children[1]), source)
    for node in tree.iter_subtrees():
        kind = node.data
        if kind in _BINARY_KINDS and isinstance(node.children[0], Tree) \
                and node.children[0].data == "coalesce":
            # parser.go: "Operator (x) and coalesce expressions (??) cannot be mixed."
            op = _op_text(node)
            raise ExpressionError(f"operator ({op}) and coalesce expressions (??) cannot be "
                                  f"mixed; wrap either in parentheses (in {source!r})")
        if kind in ("closure", "pointer", "pointer_member") and not _inside_predicate(tree, node):
            raise ExpressionError(f"'#', '.name' and {{...}} predicates are only allowed as "
                                  f"arguments of {', '.join(sorted(_PREDICATE_BUILTINS))} "
                                  f"(in {source!r})")


def _op_text(node: Tree) -> str:
    for child in node.children:
        if isinstance(child, Token):
            return str(child)
        if isinstance(child, Tree) and child.data == "cmp_op":
            return " ".join(str(t) for t in child.children)
    return {"range_op": "..", "pipe_call": "|", "or_op": "||", "and_op": "&&"}.get(
        str(node.data), str(node.data))


def _check_callee(callee: object, source: str) -> None:
    if isinstance(callee, Tree) and callee.data == "name":
        _check_function(str(callee.children[0]), source)
    elif isinstance(callee, Tree) and callee.data == "member" \
            and isinstance(callee.children[0], Tree) and callee.children[0].data == "name" \
            and str(callee.children[0].children[0]) == "sprig":
        name = _prop(callee.children[1])
        if name not in SPRIG:
            raise ExpressionError(f"sprig.{name} is not supported by the local runner "
                                  f"(supported: {', '.join(sorted(SPRIG))}) (in {source!r})")
    # Anything else (a member holding a function, e.g. a map value) is checked when called.


def _check_function(name: str, source: str) -> None:
    if name in BUILTINS or name in _ENV_FUNCTIONS:
        return
    if name in _EXPR_BUILTINS_UNSUPPORTED:
        raise ExpressionError(f"the expr function {name}() is not supported by the local runner "
                              f"(in {source!r})")
    raise ExpressionError(f"unknown function {name}() (in {source!r}); the local runner supports "
                          f"{', '.join(sorted(set(BUILTINS) | set(_ENV_FUNCTIONS)))} and "
                          f"sprig.<name>")


def _inside_predicate(root: Tree, target: Tree) -> bool:
    """Whether ``target`` sits in the predicate argument of a predicate builtin (parser.go's
    depth > 0): ``filter(list, predicate)`` or ``list | filter(predicate)``."""
    def predicate_of(node: Tree) -> object:
        if node.data == "call" and isinstance(node.children[0], Tree) \
                and node.children[0].data == "name" \
                and str(node.children[0].children[0]) in _PREDICATE_BUILTINS \
                and isinstance(node.children[1], Tree) and len(node.children[1].children) > 1:
            return node.children[1].children[1]
        if node.data == "pipe_call" and str(node.children[1]) in _PREDICATE_BUILTINS \
                and isinstance(node.children[2], Tree) and node.children[2].children:
            return node.children[2].children[0]
        return None

    bodies = [predicate_of(node) for node in root.iter_subtrees()]
    return any(isinstance(body, Tree) and any(sub is target for sub in body.iter_subtrees())
               for body in bodies)


def _prop(node: object) -> str:
    if isinstance(node, Tree):
        return str(node.children[0])
    return str(node)


# ------------------------------------------------------------------------------- evaluation

class _Artifact(str):
    """An artifact in the environment of ``fromExpression`` (its stored path): Argo requires
    that expression to yield an artifact, not a string (controller/scope.go resolveArtifact)."""


_MISSING = object()


def expand(scope: Mapping[str, object]) -> dict[str, Any]:
    """util/expand: dotted names as nested maps; a name that is also the prefix of another is
    dropped (removeConflicts compares sorted neighbours)."""
    keys = sorted(scope)
    nested: dict[str, Any] = {}
    for i, key in enumerate(keys):
        if i + 1 < len(keys) and keys[i + 1].startswith(key + "."):
            continue
        *parents, leaf = key.split(".")
        holder = nested
        for part in parents:
            child = holder.get(part)
            if not isinstance(child, dict):
                child = holder[part] = {}
            holder = child
        holder.setdefault(leaf, scope[key])
    return nested


def environment(scope: Mapping[str, object]) -> dict[str, Any]:
    """``env.GetFuncMap``: the expanded scope plus Argo's functions (util/expr/env/env.go)."""
    env = expand(scope)
    env.update(_ENV_FUNCTIONS)
    env["sprig"] = dict(SPRIG)
    return env


class _Evaluator:
    def __init__(self, env: Mapping[str, Any], source: str) -> None:
        self.env = env
        self.source = source
        self.pointers: list[Any] = []  # the element under `#`, innermost last

    def fail(self, message: str) -> ExpressionError:
        return ExpressionError(f"{message} (in {self.source!r})")

    def eval(self, node: object) -> Any:  # one dispatch over the grammar's nodes
        if not isinstance(node, Tree):
            raise self.fail(f"unexpected {node!r}")
        kind = node.data
        c = node.children
        if kind == "number":
            return _number(str(c[0]))
        if kind == "string":
            return _unquote(str(c[0]))
        if kind in ("true", "false"):
            return kind == "true"
        if kind == "nil":
            return None
        if kind == "name":
            name = str(c[0])
            if name not in self.env:
                # checker/checker.go: a map env is strict at compile time.
                raise self.fail(f"unknown name {name}")
            return self.env[name]
        if kind == "paren":
            return self.eval(c[0])
        if kind == "array":
            return [self.eval(x) for x in (c[0].children if c[0] is not None else [])]
        if kind == "map_":
            out: dict[Any, Any] = {}
            for pair in (c[0].children if c[0] is not None else []):
                key, value = pair.children
                out[self.key(key)] = self.eval(value)
            return out
        if kind == "member":
            return self.fetch(self.eval(c[0]), _prop(c[1]), optional=False)
        if kind == "opt_member":
            return self.fetch(self.eval(c[0]), _prop(c[1]), optional=True)
        if kind == "index":
            return self.fetch(self.eval(c[0]), self.eval(c[1]), optional=False)
        if kind == "opt_index":
            return self.fetch(self.eval(c[0]), self.eval(c[1]), optional=True)
        if kind == "slice":
            return self.slice(self.eval(c[0]), c[1], c[3])
        if kind == "pointer":
            if not self.pointers:
                raise self.fail("'#' outside a predicate")
            if c[0] is not None:
                raise self.fail(f"#{c[0]} is not supported by the local runner")
            return self.pointers[-1]
        if kind == "pointer_member":
            if not self.pointers:
                raise self.fail("'.name' outside a predicate")
            return self.fetch(self.pointers[-1], _prop(c[0]), optional=False)
        if kind == "closure":
            return self.eval(c[0])
        if kind == "call":
            return self.call(c[0], c[1].children if c[1] is not None else [])
        if kind == "pipe_call":
            args = [c[0], *(c[2].children if c[2] is not None else [])]
            return self.call(Tree("name", [c[1]]), args)
        if kind == "not_op":
            return not self.boolean(self.eval(c[0]), "!")
        if kind == "sign":
            value = self.eval(c[1])
            if not _is_number(value):
                raise self.fail(f"invalid operation: {c[0]}{_type(value)}")
            return -value if str(c[0]) == "-" else value
        if kind == "coalesce":
            left = self.eval_guarded(c[0])
            return self.eval(c[1]) if left is None else left
        if kind in ("or_op", "and_op"):
            op = "||" if kind == "or_op" else "&&"
            left = self.boolean(self.eval(c[0]), op)
            if op == "&&" and not left:
                return False
            if op == "||" and left:
                return True
            return self.boolean(self.eval(c[1]), op)
        if kind == "compare":
            return self.compare(node)
        if kind == "range_op":
            low, high = self.eval(c[0]), self.eval(c[1])
            if not (_is_int(low) and _is_int(high)):
                raise self.fail(f"invalid operation: {_type(low)} .. {_type(high)}")
            return list(range(low, high + 1))
        if kind == "binop":
            return self.arithmetic(str(c[1]), self.eval(c[0]), self.eval(c[2]))
        if kind == "ternary":
            return self.eval(c[1]) if self.boolean(self.eval(c[0]), "?:") else self.eval(c[2])
        if kind == "elvis":
            # parser.go parseConditional: `a ?: b` is `a ? a : b`.
            cond = self.eval(c[0])
            return cond if self.boolean(cond, "?:") else self.eval(c[1])
        raise self.fail(f"{kind} is not supported by the local runner")

    def eval_guarded(self, node: object) -> Any:
        """The left of ``??``: a member chain that meets nil is nil (compiler.go: a chain inside
        ``??`` ends in the operator's nil check)."""
        if isinstance(node, Tree) and node.data in ("member", "index"):
            base = self.eval_guarded(node.children[0])
            if base is None:
                return None
            key = _prop(node.children[1]) if node.data == "member" else self.eval(
                node.children[1])
            return self.fetch(base, key, optional=True)
        return self.eval(node)

    def key(self, node: object) -> Any:
        if isinstance(node, Token):
            if node.type == "NAME":
                return str(node)
            if node.type == "STRING":
                return _unquote(str(node))
            return _number(str(node))
        return self.eval(node)

    def boolean(self, value: Any, op: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(f"invalid operation: {op} on {_type(value)} (a bool is needed)")
        return value

    def fetch(self, obj: Any, key: Any, *, optional: bool) -> Any:
        if obj is None:
            if optional:
                return None
            raise self.fail(f"cannot fetch {key} from <nil>")
        if isinstance(obj, dict):
            return obj.get(key)
        if isinstance(obj, list | str):
            if isinstance(obj, _Artifact) and key == "path":
                return obj
            if not _is_int(key):
                raise self.fail(f"cannot fetch {key} from {_type(obj)}")
            index = key + len(obj) if key < 0 else key
            if not 0 <= index < len(obj):
                raise self.fail(f"index out of range: {key} (array length is {len(obj)})")
            return obj[index]
        raise self.fail(f"cannot fetch {key} from {_type(obj)}")

    def slice(self, obj: Any, low_node: object, high_node: object) -> Any:
        if not isinstance(obj, list | str):
            raise self.fail(f"cannot slice {_type(obj)}")
        low = 0 if low_node is None else self.eval(low_node)
        high = len(obj) if high_node is None else self.eval(high_node)
        if not (_is_int(low) and _is_int(high)):
            raise self.fail("slice bounds must be integers")
        return obj[low:high]

    def compare(self, node: Tree) -> bool:
        left_node, op_node, right_node = node.children
        op = " ".join(str(t) for t in op_node.children)
        # parser.go parseComparison: `a < b < c` is `a < b && b < c`.
        if op in _RELATIONAL and isinstance(left_node, Tree) and left_node.data == "compare":
            inner_op = " ".join(str(t) for t in left_node.children[1].children)
            if inner_op in _RELATIONAL:
                if not self.compare(left_node):
                    return False
                return self.relation(op, self.eval(left_node.children[2]),
                                     self.eval(right_node))
        return self.relation(op, self.eval(left_node), self.eval(right_node))

    def relation(self, op: str, a: Any, b: Any) -> bool:
        negate = op.startswith("not ")
        op = op.removeprefix("not ")
        if op == "==":
            return _equal(a, b)
        if op == "!=":
            return not _equal(a, b)
        if op in _RELATIONAL:
            if (_is_number(a) and _is_number(b)) or (isinstance(a, str) and isinstance(b, str)):
                return {"<": a < b, ">": a > b, "<=": a <= b, ">=": a >= b}[op]
            raise self.fail(f"invalid operation: {_type(a)} {op} {_type(b)}")
        if op == "in":
            if b is None:
                found = False
            elif isinstance(b, list):
                found = any(_equal(x, a) for x in b)
            elif isinstance(b, dict):
                found = a in b
            else:
                raise self.fail(f'operator "in" not defined on {_type(b)}')
        else:
            if not (isinstance(a, str) and isinstance(b, str)):
                raise self.fail(f"invalid operation: {_type(a)} {op} {_type(b)}")
            if op == "matches":
                try:
                    found = re.search(b, a) is not None
                except re.error as exc:
                    raise self.fail(f"bad regular expression {b!r}: {exc}") from None
            elif op == "contains":
                found = b in a
            elif op == "startsWith":
                found = a.startswith(b)
            else:
                found = a.endswith(b)
        return not found if negate else found

    def arithmetic(self, op: str, a: Any, b: Any) -> Any:
        if op == "+" and isinstance(a, str) and isinstance(b, str):
            return a + b
        if op == "+" and isinstance(a, list) and isinstance(b, list):
            return a + b
        if not (_is_number(a) and _is_number(b)):
            raise self.fail(f"invalid operation: {_type(a)} {op} {_type(b)}")
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if op == "/":
            # runtime.Divide: always float64; a zero divisor gives ±Inf/NaN, as in Go.
            if b == 0:
                return math.nan if a == 0 else math.copysign(math.inf, a)
            return float(a) / float(b)
        if op == "%":
            if not (_is_int(a) and _is_int(b)):
                raise self.fail(f"invalid operation: {_type(a)} % {_type(b)}")
            if b == 0:
                raise self.fail("integer divide by zero")
            return int(math.fmod(a, b))  # Go's % truncates toward zero
        return float(a) ** float(b)  # ** and ^: math.Pow

    def call(self, callee: object, arg_nodes: list) -> Any:
        if isinstance(callee, Tree) and callee.data == "name":
            name = str(callee.children[0])
            if name in _PREDICATE_BUILTINS:
                return self.predicate(name, arg_nodes)
            if name in BUILTINS:
                return self.apply(name, BUILTINS[name], [self.eval(a) for a in arg_nodes])
        function = self.eval(callee)
        if isinstance(function, _Refused):
            raise self.fail(f"{function.name} is not supported by the local runner")
        if not callable(function):
            raise self.fail(f"{_type(function)} is not a function")
        name = _callee_name(callee)
        return self.apply(name, function, [self.eval(a) for a in arg_nodes])

    def apply(self, name: str, function: Callable[..., Any], args: list) -> Any:
        try:
            return function(*args)
        except ExpressionError as exc:
            raise self.fail(f"{name}: {exc}") from None
        except (TypeError, ValueError, KeyError, IndexError, ZeroDivisionError) as exc:
            raise self.fail(f"{name}: {exc}") from None

    def predicate(self, name: str, arg_nodes: list) -> Any:
        if len(arg_nodes) != 2:
            raise self.fail(f"{name}() takes 2 arguments (got {len(arg_nodes)})")
        items = self.eval(arg_nodes[0])
        if items is None:
            items = []
        if isinstance(items, dict):
            items = list(items.values())
        if not isinstance(items, list):
            raise self.fail(f"{name}(): cannot iterate over {_type(items)}")
        body = arg_nodes[1]

        def test(item: Any) -> Any:
            self.pointers.append(item)
            try:
                return self.eval(body)
            finally:
                self.pointers.pop()

        if name == "map":
            return [test(x) for x in items]
        if name == "count":
            return sum(1 for x in items if self.boolean(test(x), name))
        if name == "filter":
            return [x for x in items if self.boolean(test(x), name)]
        results = (self.boolean(test(x), name) for x in items)
        if name == "all":
            return all(results)
        if name == "any":
            return any(results)
        if name == "none":
            return not any(results)
        if name == "one":
            return sum(1 for r in results if r) == 1
        for x in items:  # find
            if self.boolean(test(x), name):
                return x
        return None


def _callee_name(callee: object) -> str:
    if isinstance(callee, Tree) and callee.data == "name":
        return str(callee.children[0])
    if isinstance(callee, Tree) and callee.data == "member":
        return f"{_callee_name(callee.children[0])}.{_prop(callee.children[1])}"
    return "function"


def evaluate(source: str, scope: Mapping[str, object], *, tree: Tree | None = None,
             env: Mapping[str, Any] | None = None) -> Any:
    """The value of ``source`` against the variables ``scope`` (dotted names)."""
    tree = parse(source) if tree is None else tree
    return _Evaluator(environment(scope) if env is None else env, source).eval(tree)


# ---------------------------------------------------------------------- where Argo uses it

def missing_references(tree: Tree, env: Mapping[str, Any]) -> list[str]:
    """util/template/expression_template.go missingVarsInEnv: the names and pure member paths
    (``a.b["c"]``) the expression reads that the environment lacks; member paths on the left
    of ``??`` or under ``?.`` are not required."""
    guarded: set[int] = set()
    for node in tree.iter_subtrees():
        if node.data == "coalesce":
            for inner in _subtrees(node.children[0]):
                if inner.data in ("member", "index"):
                    guarded.add(id(inner))
        if node.data in ("opt_member", "opt_index"):
            guarded.add(id(node.children[0]))
    missing: list[str] = []
    for node in tree.iter_subtrees_topdown():
        if id(node) in guarded:
            continue
        if node.data == "name" and str(node.children[0]) not in env \
                and str(node.children[0]) not in BUILTINS:
            missing.append(str(node.children[0]))
        elif node.data in ("member", "index"):
            path = _member_path(node)
            if path and _lookup(env, path) is _MISSING:
                missing.append(".".join(path))
    return list(dict.fromkeys(missing))


def _subtrees(node: object) -> list[Tree]:
    return list(node.iter_subtrees()) if isinstance(node, Tree) else []


def _member_path(node: Tree) -> list[str] | None:
    parts: list[str] = []
    current: object = node
    while isinstance(current, Tree) and current.data in ("member", "index"):
        prop = current.children[1]
        if current.data == "member":
            parts.insert(0, _prop(prop))
        elif isinstance(prop, Tree) and prop.data == "string":
            parts.insert(0, _unquote(str(prop.children[0])))
        else:
            return None
        current = current.children[0]
    if isinstance(current, Tree) and current.data == "name":
        return [str(current.children[0]), *parts]
    return None


def _lookup(env: Mapping[str, Any], path: list[str]) -> Any:
    current: Any = env
    for part in path:
        if not isinstance(current, Mapping) or part not in current:
            return _MISSING
        current = current[part]
    return current


def render_tag(source: str, scope: Mapping[str, object]) -> str:
    """A ``{{=...}}`` tag's text (expressionReplaceCore): the result JSON-encoded, a string's
    quotes dropped; a name or member path the scope lacks, or a nil result, is an error."""
    tree = parse(source)
    env = environment(scope)
    missing = missing_references(tree, env)
    if missing:
        raise ExpressionError(f"failed to evaluate expression: {missing[0]} is missing "
                              f"(in {source!r})")
    result = _Evaluator(env, source).eval(tree)
    if result is None:
        raise ExpressionError(f"failed to evaluate expression {source!r}: the result is nil")
    if isinstance(result, str):
        return str(result)
    return go_json(result)


def output_parameter(source: str, scope: Mapping[str, object]) -> str:
    """``outputs.parameters[].valueFrom.expression`` (controller/scope.go resolveParameter):
    a nil result is an error; the value is Go's ``%v`` of the result (wfv1.AnyStringPtr)."""
    result = evaluate(source, scope)
    if result is None:
        raise ExpressionError(f"failed to evaluate expression {source!r}: the result is nil")
    return go_format(result)


def artifact_path(source: str, scope: Mapping[str, str]) -> str:
    """``fromExpression`` (controller/scope.go resolveArtifact): the expression must yield an
    artifact (here its stored path), not a plain string."""
    marked: dict[str, object] = {}
    for key, value in scope.items():
        if ".artifacts." in key and not key.endswith(".path"):
            marked[key] = _Artifact(value)
        elif ".artifacts." in key and key.removesuffix(".path") in scope:
            continue  # `inputs.artifacts.x.path` would hide the artifact `inputs.artifacts.x`
        else:
            marked[key] = value
    result = evaluate(source, marked)
    if not isinstance(result, _Artifact):
        raise ExpressionError(f"fromExpression {source!r} is not an artifact (got "
                              f"{_type(result)} {result!r})")
    return str(result)


# ------------------------------------------------------------------------- values, as Go

def _type(value: Any) -> str:
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "[]interface {}"
    if isinstance(value, dict):
        return "map[string]interface {}"
    return "func"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _equal(a: Any, b: Any) -> bool:
    # runtime.Equal: numbers across int/float, otherwise same type and value (DeepEqual).
    if _is_number(a) and _is_number(b):
        return a == b
    if type(a) is not type(b) and not (isinstance(a, str) and isinstance(b, str)):
        return False
    return bool(a == b)


def _number(text: str) -> int | float:
    value = text.replace("_", "")
    lower = value.lower()
    if lower.startswith(("0x", "0b", "0o")):
        return int(value, 0)
    if "." in lower or "e" in lower:
        return float(value)
    return int(value)


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v",
            "\\": "\\", '"': '"', "'": "'", "0": "\0"}


def _unquote(text: str) -> str:
    if text.startswith("`"):
        return text[1:-1]

    def escape(match: re.Match[str]) -> str:
        body = match.group(1)
        if body[0] in "uUx":
            return chr(int(body[1:], 16))
        return _ESCAPES.get(body, "\\" + body)

    return re.sub(r"\\(u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|x[0-9a-fA-F]{2}|.)", escape, text[1:-1])


def _float_parts(value: float) -> tuple[str, int]:
    """The shortest round-tripping decimal digits of ``value`` (strconv's shortest, as
    Python's ``repr``) and the exponent of the first digit."""
    from decimal import Decimal

    _, digits, exponent = Decimal(repr(abs(value))).normalize().as_tuple()
    text = "".join(map(str, digits))
    return text, len(text) - 1 + int(exponent)


def _go_float(value: float, *, json_style: bool) -> str:
    if math.isnan(value) or math.isinf(value):
        if json_style:
            raise ExpressionError(f"json: unsupported value: {value}")
        return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
    if value == 0:
        return "-0" if math.copysign(1, value) < 0 and not json_style else "0"
    digits, exp = _float_parts(value)
    sign = "-" if value < 0 else ""
    # encoding/json floatEncoder: 'e' below 1e-6 and from 1e21; fmt %v: strconv 'g' shortest,
    # %e when exp < -4 || exp >= 6 (strconv/ftoa.go).
    scientific = (abs(value) < 1e-6 or abs(value) >= 1e21) if json_style else (exp < -4 or exp >= 6)
    if scientific:
        mant = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        width = 1 if json_style else 2
        return f"{sign}{mant}e{'-' if exp < 0 else '+'}{abs(exp):0{width}d}"
    if exp < 0:
        return f"{sign}0.{'0' * (-exp - 1)}{digits}"
    if exp + 1 >= len(digits):
        return f"{sign}{digits}{'0' * (exp + 1 - len(digits))}"
    return f"{sign}{digits[:exp + 1]}.{digits[exp + 1:]}"


def go_json(value: Any) -> str:
    """encoding/json's Marshal: compact, map keys sorted, ``<>&`` escaped, floats as Go."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _go_float(value, json_style=True)
    if isinstance(value, str):
        return go_string(value)
    if isinstance(value, list):
        return "[" + ",".join(go_json(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{go_json(str(k))}:{go_json(value[k])}"
                              for k in sorted(value, key=str)) + "}"
    raise ExpressionError(f"json: unsupported type: {_type(value)}")


def go_format(value: Any) -> str:
    """fmt's ``%v``."""
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _go_float(value, json_style=False)
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "[" + " ".join(go_format(v) for v in value) + "]"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{go_format(k)}:{go_format(value[k])}"
                                 for k in sorted(value, key=str)) + "]"
    return "<func>"


# ------------------------------------------------------------------------------ functions

def _to_int(value: Any) -> int:
    # builtin.Int (Argo's asInt): numbers truncate, strings go through strconv.Atoi.
    if isinstance(value, bool):
        raise ExpressionError(f"invalid argument for int (type {_type(value)})")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    if isinstance(value, str):
        if not re.fullmatch(r"[+-]?\d+", value):
            raise ExpressionError(f'strconv.Atoi: parsing "{value}": invalid syntax')
        return int(value)
    raise ExpressionError(f"invalid argument for int (type {_type(value)})")


def _to_float(value: Any) -> float:
    # builtin.Float (Argo's asFloat): strings through strconv.ParseFloat.
    if isinstance(value, bool):
        raise ExpressionError(f"invalid argument for float (type {_type(value)})")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.replace("_", "") if "_" not in value else "x")
        except ValueError:
            raise ExpressionError(f'strconv.ParseFloat: parsing "{value}": invalid syntax'
                                  ) from None
    raise ExpressionError(f"invalid argument for float (type {_type(value)})")


def _len(value: Any) -> int:
    if isinstance(value, str | list | dict):
        return len(value)
    raise ExpressionError(f"invalid argument for len (type {_type(value)})")


def _strings(*values: Any) -> None:
    for value in values:
        if not isinstance(value, str):
            raise ExpressionError(f"a string is needed, not {_type(value)}")


def _max(*values: Any) -> Any:
    flat = _flatten_numbers(values)
    return max(flat)


def _min(*values: Any) -> Any:
    flat = _flatten_numbers(values)
    return min(flat)


def _flatten_numbers(values: tuple) -> list:
    flat: list = []
    for value in values:
        flat.extend(value if isinstance(value, list) else [value])
    if not flat or not all(_is_number(v) for v in flat):
        raise ExpressionError("needs numbers")
    return flat


def _split(s: str, sep: str, n: int = -1) -> list[str]:
    _strings(s, sep)
    if n == 0:
        return []
    parts = s.split(sep) if n < 0 else s.split(sep, n - 1)
    return parts


def _join(items: Any, sep: str = "") -> str:
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise ExpressionError("join() needs a list of strings")
    return sep.join(items)


def _round(value: Any) -> float:
    if not _is_number(value):
        raise ExpressionError(f"invalid argument for round (type {_type(value)})")
    return float(math.floor(abs(value) + 0.5) * (1 if value >= 0 else -1))


def _type_name(value: Any) -> str:
    # builtin "type": expr's names for its kinds.
    if value is None:
        return "nil"
    return {"bool": "bool", "int": "int", "float64": "float", "string": "string",
            "[]interface {}": "array", "map[string]interface {}": "map"}.get(_type(value), "func")


def _from_json(text: str) -> Any:
    _strings(text)
    return json.loads(text)


def _json_path(document: Any, path: Any) -> Any:
    """Argo's ``jsonpath(json, path)``: see ``jsonpath`` (loaded, with jsonpath-ng, only when
    an expression calls it)."""
    from .jsonpath import JsonPathError, jsonpath

    try:
        return jsonpath(document, path)
    except JsonPathError as exc:
        raise ExpressionError(str(exc)) from None


def _check_json_paths(tree: Tree, source: str) -> None:
    """A literal path given to ``jsonpath`` is checked when the manifest loads: one the local
    runner refuses (or that does not parse) stops the run before anything starts."""
    for node in tree.iter_subtrees():
        if node.data != "call" or not isinstance(node.children[0], Tree) \
                or node.children[0].data != "name" \
                or str(node.children[0].children[0]) != "jsonpath":
            continue
        args = [a for a in node.children[1].children if a is not None] \
            if isinstance(node.children[1], Tree) else []
        if len(args) == 2 and isinstance(args[1], Tree) and args[1].data == "string":
            from .jsonpath import JsonPathError, compile_path

            try:
                compile_path(_unquote(str(args[1].children[0])))
            except JsonPathError as exc:
                raise ExpressionError(f"{exc} (in {source!r})") from None


BUILTINS: dict[str, Callable[..., Any]] = {
    "len": _len,
    "type": _type_name,
    "abs": lambda x: abs(x) if _is_number(x) else _bad("abs", x),
    "ceil": lambda x: float(math.ceil(x)) if _is_number(x) else _bad("ceil", x),
    "floor": lambda x: float(math.floor(x)) if _is_number(x) else _bad("floor", x),
    "round": _round,
    "int": _to_int,
    "float": _to_float,
    "string": go_format,
    "trim": lambda s, chars=None: (_strings(s), s.strip(chars) if chars is not None
                                   else s.strip(" \t\n\r\v\f"))[1],
    "trimPrefix": lambda s, p=" ": (_strings(s, p), s.removeprefix(p))[1],
    "trimSuffix": lambda s, p=" ": (_strings(s, p), s.removesuffix(p))[1],
    "upper": lambda s: (_strings(s), s.upper())[1],
    "lower": lambda s: (_strings(s), s.lower())[1],
    "split": _split,
    "replace": lambda s, old, new: (_strings(s, old, new), s.replace(old, new))[1],
    "repeat": lambda s, n: (_strings(s), s * _to_int(n))[1],
    "join": _join,
    "indexOf": lambda s, sub: (_strings(s, sub), s.find(sub))[1],
    "lastIndexOf": lambda s, sub: (_strings(s, sub), s.rfind(sub))[1],
    "hasPrefix": lambda s, p: (_strings(s, p), s.startswith(p))[1],
    "hasSuffix": lambda s, p: (_strings(s, p), s.endswith(p))[1],
    "max": _max,
    "min": _min,
    "sum": lambda xs: sum(_flatten_numbers((xs,))) if xs else 0,
    "toJSON": lambda v: json.dumps(json.loads(go_json(v)), indent=2, ensure_ascii=False),
    "fromJSON": _from_json,
    "toBase64": lambda s: (_strings(s), base64.b64encode(s.encode()).decode())[1],
    "fromBase64": lambda s: (_strings(s), base64.b64decode(s.encode()).decode())[1],
    "first": lambda xs: xs[0] if isinstance(xs, list) and xs else None,
    "last": lambda xs: xs[-1] if isinstance(xs, list) and xs else None,
    "get": lambda obj, key: (obj.get(key) if isinstance(obj, dict) else
                             obj[key] if isinstance(obj, list) and _is_int(key)
                             and -len(obj) <= key < len(obj) else None),
    "keys": lambda m: list(m) if isinstance(m, dict) else _bad("keys", m),
    "values": lambda m: list(m.values()) if isinstance(m, dict) else _bad("values", m),
    "reverse": lambda xs: list(reversed(xs)) if isinstance(xs, list) else _bad("reverse", xs),
    "concat": lambda *xss: [x for xs in xss for x in xs],
}
_PREDICATE_BUILTINS = frozenset({"all", "none", "any", "one", "filter", "map", "find", "count"})
# expr's other builtins (builtin/builtin.go): refused by name.
_EXPR_BUILTINS_UNSUPPORTED = frozenset({
    "findIndex", "findLast", "findLastIndex", "groupBy", "sortBy", "reduce", "splitAfter",
    "mean", "median", "now", "duration", "date", "timezone", "take", "toPairs", "fromPairs",
    "uniq", "flatten", "sort", "bitnot", "bitand", "bitor", "bitxor", "bitnand", "bitshl",
    "bitshr", "bitushr"})
for _name in _PREDICATE_BUILTINS:
    BUILTINS[_name] = lambda *a: None  # never called: Evaluator.predicate handles them


def _bad(name: str, value: Any) -> Any:
    raise ExpressionError(f"invalid argument for {name} (type {_type(value)})")


def _to_json(value: Any) -> str:
    return go_json(value)  # env.go toJSON: json.Marshal


_ENV_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "asInt": _to_int,
    "asFloat": _to_float,
    "jsonpath": _json_path,
    "toJson": _to_json,
}


# sprig (github.com/Masterminds/sprig/v3, GenericFuncMap): the common ones, with sprig's argument
# order (the subject last: `sprig.replace(old, new, s)`) and its loose conversions (cast.ToInt64,
# strval).

class _Refused:
    def __init__(self, name: str) -> None:
        self.name = name


def _strval(value: Any) -> str:
    # sprig strval: strings as they are, nil as "", the rest with %v.
    if value is None:
        return ""
    return value if isinstance(value, str) else go_format(value)


def _int64(value: Any) -> int:
    # sprig toInt64 (cast.ToInt64): strings parsed (0 when unparsable), floats truncated.
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    if isinstance(value, str):
        try:
            return int(value, 0) if re.fullmatch(r"[+-]?(0[xXoObB])?[\da-fA-F]+", value) \
                else int(float(value))
        except ValueError:
            return 0
    return 0


def _float64(value: Any) -> float:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return 0.0
    return 0.0


def _empty(value: Any) -> bool:
    # sprig empty: nil, "", 0, false, and empty lists and maps.
    return value is None or value is False or value in ("", [], {}) \
        or (_is_number(value) and value == 0)


def _default(default: Any, *given: Any) -> Any:
    return default if not given or _empty(given[0]) else given[0]


def _sprig_div(a: Any, b: Any) -> int:
    x, y = _int64(a), _int64(b)
    if y == 0:
        raise ExpressionError("integer divide by zero")
    return int(x / y)  # Go integer division truncates toward zero


def _sprig_mod(a: Any, b: Any) -> int:
    x, y = _int64(a), _int64(b)
    if y == 0:
        raise ExpressionError("integer divide by zero")
    return int(math.fmod(x, y))


def _sprig_split(sep: str, text: str) -> dict[str, str]:
    return {f"_{i}": part for i, part in enumerate(_strval(text).split(sep))}


def _sprig_substr(start: Any, end: Any, text: str) -> str:
    s, e = _int64(start), _int64(end)
    if s < 0:
        return text[:e]
    if e < 0 or e > len(text):
        return text[s:]
    return text[s:e]


def _sprig_trunc(count: Any, text: str) -> str:
    n = _int64(count)
    if n < 0 and len(text) + n > 0:
        return text[len(text) + n:]
    if n >= 0 and len(text) > n:
        return text[:n]
    return text


def _title(text: str) -> str:
    return re.sub(r"(^|[^\w'])(\w)", lambda m: m.group(1) + m.group(2).upper(), text)


SPRIG: dict[str, Callable[..., Any]] = {
    "trim": lambda s: _strval(s).strip(" \t\n\r\v\f"),
    "trimAll": lambda cut, s: _strval(s).strip(cut),
    "trimPrefix": lambda prefix, s: _strval(s).removeprefix(prefix),
    "trimSuffix": lambda suffix, s: _strval(s).removesuffix(suffix),
    "upper": lambda s: _strval(s).upper(),
    "lower": lambda s: _strval(s).lower(),
    "title": lambda s: _title(_strval(s)),
    "replace": lambda old, new, s: _strval(s).replace(old, new),
    "contains": lambda sub, s: sub in _strval(s),
    "hasPrefix": lambda prefix, s: _strval(s).startswith(prefix),
    "hasSuffix": lambda suffix, s: _strval(s).endswith(suffix),
    "repeat": lambda count, s: _strval(s) * _int64(count),
    "substr": _sprig_substr,
    "trunc": _sprig_trunc,
    "nospace": lambda s: re.sub(r"\s", "", _strval(s)),
    "quote": lambda *items: " ".join(json.dumps(_strval(i)) for i in items if i is not None),
    "squote": lambda *items: " ".join(f"'{_strval(i)}'" for i in items if i is not None),
    "cat": lambda *items: " ".join(_strval(i) for i in items if i is not None),
    "split": _sprig_split,
    "splitList": lambda sep, s: _strval(s).split(sep),
    "join": lambda sep, items: sep.join(_strval(i) for i in (
        items if isinstance(items, list) else [items])),
    "toString": _strval,
    "atoi": lambda s: int(s) if re.fullmatch(r"[+-]?\d+", _strval(s)) else 0,
    "int": lambda v: _int64(v),
    "int64": lambda v: _int64(v),
    "float64": _float64,
    "default": _default,
    "empty": _empty,
    "coalesce": lambda *values: next((v for v in values if not _empty(v)), None),
    "ternary": lambda yes, no, condition: yes if condition is True else no,
    "add": lambda *values: sum(_int64(v) for v in values),
    "add1": lambda value: _int64(value) + 1,
    "sub": lambda a, b: _int64(a) - _int64(b),
    "mul": lambda *values: math.prod(_int64(v) for v in values),
    "div": _sprig_div,
    "mod": _sprig_mod,
    "max": lambda a, *rest: max(_int64(v) for v in (a, *rest)),
    "min": lambda a, *rest: min(_int64(v) for v in (a, *rest)),
    "toJson": _to_json,
    "b64enc": lambda s: base64.b64encode(_strval(s).encode()).decode(),
    "b64dec": lambda s: base64.b64decode(_strval(s).encode()).decode(),
    "list": lambda *items: list(items),
    "first": lambda items: items[0] if isinstance(items, list) and items else None,
    "last": lambda items: items[-1] if isinstance(items, list) and items else None,
}


def site_problems(sites: list[tuple[str, str, str]]) -> list[str]:
    """The manifest checker's view of ``substitution.expression_sites``: each expression that
    does not parse, or uses what the local runner does not support, named with its path."""
    problems: list[str] = []
    for path, source, problem in sites:
        if problem:
            problems.append(f"{path}: {problem}")
            continue
        try:
            parse(source)
        except ExpressionError as exc:
            problems.append(f"{path}: {exc}")
    return problems
