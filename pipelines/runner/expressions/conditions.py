"""Evaluators for DAG ``depends`` logic and ``when`` conditions.

Both are tiny recursive-descent parsers; Argo uses govaluate for ``when``, and after
substitution it turns unknown bare words into strings, so ``heads == heads`` is true.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

# The `depends` grammar is Argo's vocabulary, shared with the linter (argo_terms); the runner
# evaluates what it parses. ExpressionError is the one error of both grammars.
from sublimate.pipelines.argo_terms import (  # noqa: F401  (re-exported to the runner)
    Ast,
    ExpressionError,
    TokenCursor,
    depends_references,
    parse_depends,
)


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

# govaluate's tokenizer (github.com/Knetic/govaluate, lexerState/parsing.go): a bare word starts
# with a letter and goes on with letters, digits, ``_`` and ``.``; a number is digits and dots;
# ``+ - * / %`` are modifiers. So an unquoted ``foo-bar`` is ``foo - bar``: Argo turns the
# variables into strings (steps.go shouldExecute) and govaluate refuses ``-`` on strings.
_WHEN_TOKEN = re.compile(
    r"""\s*(?:(?P<op>&&|\|\||==|!=|<=|>=|=~|!~|<|>|!|\(|\)|\+|-|\*|/|%)"""
    r"""|(?P<str>'[^']*'|"[^"]*")|(?P<num>[0-9.]+)|(?P<word>[^\W\d_][\w.]*))"""
)
_WHEN_HINT = " (hint: try wrapping the affected expression in quotes (\"))"
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
            raise ExpressionError(f"Invalid 'when' expression {expr!r}: Invalid token: "
                                  f"{text[pos:].strip()[:1]!r}{_WHEN_HINT}")
        pos = match.end()
        if match.group("op"):
            tokens.append(match.group("op"))
        elif match.group("str") is not None:
            raw = match.group("str")[1:-1]
            tokens.append(_Literal(raw, raw))
        elif match.group("num") is not None:
            number = match.group("num")
            try:
                tokens.append(_Literal(float(number), number))
            except ValueError:
                raise ExpressionError(f"Invalid 'when' expression {expr!r}: Unable to parse "
                                      f"numeric value {number!r} to float64") from None
        else:
            word = match.group("word")
            tokens.append(_Literal(_word_value(word), word))
    return tokens


def _word_value(word: str) -> object:
    if word == "true":
        return True
    if word == "false":
        return False
    return word  # govaluate variables become strings after Argo's substitution


class _WhenParser(TokenCursor):
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
        left = self.parse_additive()
        while self.peek() in _COMPARISONS:
            op = str(self.take())
            right = self.parse_additive()
            left = _Literal(_compare(op, left, right, self.source), "")
        return left

    def parse_additive(self) -> object:
        left = self.parse_multiplicative()
        while self.peek() in ("+", "-"):
            op = str(self.take())
            left = _modify(op, left, self.parse_multiplicative(), self.source)
        return left

    def parse_multiplicative(self) -> object:
        left = self.parse_unary()
        while self.peek() in ("*", "/", "%"):
            op = str(self.take())
            left = _modify(op, left, self.parse_unary(), self.source)
        return left

    def parse_unary(self) -> object:
        token = self.take()
        if token == "!":
            return _Literal(not _truth(self.parse_unary(), self.source), "")
        if token == "-":
            operand = self.parse_unary()
            if not isinstance(operand, _Literal) or not isinstance(operand.value, float):
                raise ExpressionError(f"Failed to evaluate 'when' expression {self.source!r}: "
                                      f"Value {_shown(operand)!r} cannot be used with the "
                                      f"prefix '-'")
            return _Literal(-operand.value, f"-{operand.text}")
        if token == "(":
            inner = self.parse_or()
            if self.take() != ")":
                raise ExpressionError(f"missing ')' in when {self.source!r}")
            return inner
        if isinstance(token, _Literal):
            return token
        raise ExpressionError(f"unexpected {token!r} in when {self.source!r}")


def _shown(value: object) -> object:
    return value.value if isinstance(value, _Literal) else value


def _modify(op: str, left: object, right: object, source: str) -> _Literal:
    """govaluate's modifiers: ``+`` adds numbers or joins when either side is a string; the
    others need numbers ("Value 'x' cannot be used with the modifier '-', it is not a
    number")."""
    a, b = _shown(left), _shown(right)
    if op == "+" and (isinstance(a, str) or isinstance(b, str)):
        joined = f"{_text_of(a)}{_text_of(b)}"
        return _Literal(joined, joined)
    for value in (a, b):
        if not isinstance(value, float):
            raise ExpressionError(f"Failed to evaluate 'when' expression {source!r}: Value "
                                  f"{value!r} cannot be used with the modifier '{op}', it is "
                                  f"not a number{_WHEN_HINT}")
    assert isinstance(a, float) and isinstance(b, float)
    if op in ("/", "%") and b == 0:
        result = math.inf if op == "/" and a > 0 else -math.inf if op == "/" and a < 0 \
            else math.nan
    else:
        result = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else 0.0,
                  "%": math.fmod(a, b) if b else 0.0}[op]
    return _Literal(result, _text_of(result))


def _text_of(value: object) -> str:
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


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
