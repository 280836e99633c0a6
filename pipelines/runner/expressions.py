"""Evaluators for DAG ``depends`` logic and ``when`` conditions.

Both are tiny recursive-descent parsers; Argo uses govaluate for ``when``, and after
substitution it turns unknown bare words into strings, so ``heads == heads`` is true.
"""

from __future__ import annotations

import re
from collections.abc import Callable

# The `depends` grammar is Argo's vocabulary, shared with the linter (argo_terms); the runner
# evaluates what it parses. ExpressionError is the one error of both grammars.
from sublimate.pipelines.argo_terms import (  # noqa: F401  (re-exported to the runner)
    Ast,
    ExpressionError,
    depends_references,
    parse_depends,
)


class _Parser:
    def __init__(self, tokens: list, source: str) -> None:
        self.tokens = tokens
        self.pos = 0
        self.source = source

    def peek(self) -> object:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> object:
        token = self.peek()
        if token is None:
            raise ExpressionError(f"unexpected end of expression {self.source!r}")
        self.pos += 1
        return token

    def expect_end(self) -> None:
        if self.pos != len(self.tokens):
            raise ExpressionError(f"unexpected {self.peek()!r} in expression {self.source!r}")


def evaluate_depends(ast: Ast, lookup: Callable[[str, str | None], bool]) -> bool:
    kind = ast[0]
    if kind == "ref":
        return lookup(ast[1], ast[2])
    if kind == "not":
        return not evaluate_depends(ast[1], lookup)
    if kind == "and":
        return evaluate_depends(ast[1], lookup) and evaluate_depends(ast[2], lookup)
    return evaluate_depends(ast[1], lookup) or evaluate_depends(ast[2], lookup)


# ------------------------------------------------------------------------------- when

_WHEN_TOKEN = re.compile(
    r"""\s*(?:(?P<op>&&|\|\||==|!=|<=|>=|=~|!~|<|>|!|\(|\))"""
    r"""|(?P<str>'[^']*'|"[^"]*")|(?P<word>[^\s()!=<>&|'"~]+))"""
)
_COMPARISONS = ("==", "!=", "<", ">", "<=", ">=", "=~", "!~")


class _Literal:
    """A value token; ``text`` keeps the source spelling for regex matching."""

    __slots__ = ("text", "value")

    def __init__(self, value: object, text: str) -> None:
        self.value = value
        self.text = text


def _tokenize_when(expr: str) -> list:
    tokens: list = []
    pos = 0
    text = expr.rstrip()
    while pos < len(text):
        match = _WHEN_TOKEN.match(text, pos)
        if not match:
            raise ExpressionError(f"unexpected {text[pos:].strip()!r} in when {expr!r}")
        pos = match.end()
        if match.group("op"):
            tokens.append(match.group("op"))
        elif match.group("str") is not None:
            raw = match.group("str")[1:-1]
            tokens.append(_Literal(raw, raw))
        else:
            word = match.group("word")
            tokens.append(_Literal(_word_value(word), word))
    return tokens


def _word_value(word: str) -> object:
    if word == "true":
        return True
    if word == "false":
        return False
    try:
        return float(word)
    except ValueError:
        return word  # govaluate variables become strings after Argo's substitution


class _WhenParser(_Parser):
    def parse_or(self) -> object:
        left = self.parse_and()
        while self.peek() == "||":
            self.take()
            right = self.parse_and()
            left = _truth(left, self.source) or _truth(right, self.source)
        return left

    def parse_and(self) -> object:
        left = self.parse_comparison()
        while self.peek() == "&&":
            self.take()
            right = self.parse_comparison()
            left = _truth(left, self.source) and _truth(right, self.source)
        return left

    def parse_comparison(self) -> object:
        left = self.parse_unary()
        while self.peek() in _COMPARISONS:
            op = str(self.take())
            right = self.parse_unary()
            left = _Literal(_compare(op, left, right, self.source), "")
        return left

    def parse_unary(self) -> object:
        token = self.take()
        if token == "!":
            return _Literal(not _truth(self.parse_unary(), self.source), "")
        if token == "(":
            inner = self.parse_or()
            if self.take() != ")":
                raise ExpressionError(f"missing ')' in when {self.source!r}")
            return inner
        if isinstance(token, _Literal):
            return token
        raise ExpressionError(f"unexpected {token!r} in when {self.source!r}")


def _truth(value: object, source: str) -> bool:
    raw = value.value if isinstance(value, _Literal) else value
    if isinstance(raw, bool):
        return raw
    raise ExpressionError(f"when {source!r}: {raw!r} is not a boolean")


def _compare(op: str, left: _Literal, right: _Literal, source: str) -> bool:
    a, b = left.value, right.value
    if op in ("=~", "!~"):
        try:
            found = re.search(right.text, left.text) is not None
        except re.error as exc:
            raise ExpressionError(f"when {source!r}: bad regex {right.text!r}: {exc}") from exc
        return found if op == "=~" else not found
    numeric = isinstance(a, float) and isinstance(b, float)
    if op in ("==", "!="):
        equal = a == b if (numeric or type(a) is type(b)) else False
        return equal if op == "==" else not equal
    if not (numeric or (isinstance(a, str) and isinstance(b, str))):
        raise ExpressionError(f"when {source!r}: cannot compare {left.text!r} {op} {right.text!r}")
    if op == "<":
        return a < b  # type: ignore[operator]
    if op == ">":
        return a > b  # type: ignore[operator]
    if op == "<=":
        return a <= b  # type: ignore[operator]
    return a >= b  # type: ignore[operator]


def evaluate_when(expr: str) -> bool:
    """Evaluate an already-substituted ``when`` expression."""
    parser = _WhenParser(_tokenize_when(expr), expr)
    if not parser.tokens:
        raise ExpressionError("empty when expression")
    result = parser.parse_or()
    parser.expect_end()
    return _truth(result, expr)
