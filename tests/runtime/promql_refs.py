"""What a PromQL expression refers to: its series selectors (metric name and label
matchers) and the labels it groups or matches by. A reading for tests, not an evaluator:
function names, keywords, strings, ranges, numbers and Grafana's ``$variables`` are told
apart from metric names by the lexer below.

``label_values(SELECTOR, LABEL)``, Grafana's variable query, is read with ``label_values``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["References", "Selector", "label_values", "references"]

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
    |(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
    |(?P<var>\$\{[^}]*\}|\$\w+)
    |(?P<range>\[[^\]]*\])
    |(?P<number>(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+)[a-zA-Z]*)
    |(?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
    |(?P<punct>[{}(),]|[^\sA-Za-z0-9_:{}(),"'`$\[\]]+)
    """,
    re.VERBOSE,
)
# Words that are no metric name where they stand alone.
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"}
# Words followed by a list of label names.
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}


@dataclass(frozen=True)
class Selector:
    name: str
    matchers: tuple[tuple[str, str, str], ...] = ()  # (label, operator, value)


@dataclass
class References:
    selectors: list[Selector] = field(default_factory=list)
    grouping: set[str] = field(default_factory=set)  # labels of by/without/on/ignoring/...

    @property
    def names(self) -> set[str]:
        return {s.name for s in self.selectors}


def _tokens(expr: str) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    position = 0
    while position < len(expr):
        match = _TOKEN.match(expr, position)
        if match is None:
            raise ValueError(f"cannot read {expr[position:]!r} in {expr!r}")
        kind = match.lastgroup
        assert kind is not None
        if kind != "space":
            found.append((kind, match.group()))
        position = match.end()
    return found


def _unquote(text: str) -> str:
    body = text[1:-1]
    return body if text[0] == "`" else re.sub(r"\\(.)", r"\1", body)


def _matchers(tokens: list[tuple[str, str]], start: int) -> tuple[list[tuple[str, str, str]], int]:
    """The matchers of the ``{...}`` opening at ``start``, and the index after its ``}``."""
    matchers: list[tuple[str, str, str]] = []
    index = start + 1
    while tokens[index][1] != "}":
        if tokens[index][1] == ",":
            index += 1
            continue
        (label_kind, label), (_, operator), (value_kind, value) = tokens[index : index + 3]
        if (
            label_kind != "ident"
            or operator not in ("=", "!=", "=~", "!~")
            or value_kind != "string"
        ):
            raise ValueError(f"not a label matcher: {label} {operator} {value}")
        matchers.append((label, operator, _unquote(value)))
        index += 3
    return matchers, index + 1


def _closing(tokens: list[tuple[str, str]], start: int) -> int:
    depth = 0
    for index in range(start, len(tokens)):
        depth += {"(": 1, ")": -1}.get(tokens[index][1], 0)
        if depth == 0:
            return index
    raise ValueError("unbalanced parentheses")


def references(expr: str) -> References:
    """The selectors and grouping labels of ``expr``."""
    tokens = _tokens(expr)
    found = References()
    index = 0
    while index < len(tokens):
        kind, text = tokens[index]
        following = tokens[index + 1][1] if index + 1 < len(tokens) else None
        if kind == "ident" and text.lower() in _LABEL_LISTS and following == "(":
            end = _closing(tokens, index + 1)
            found.grouping |= {t for k, t in tokens[index + 2 : end] if k == "ident"}
            index = end + 1
        elif kind == "ident" and (
            text.lower() in _KEYWORDS or following == "(" or following in ("by", "without")
        ):
            index += 1  # a keyword, a function's name, an aggregation's (sum by (...) (...))
        elif kind == "ident":
            matchers: list[tuple[str, str, str]] = []
            index += 1
            if following == "{":
                matchers, index = _matchers(tokens, index)
            found.selectors.append(Selector(text, tuple(matchers)))
        elif text == "{":  # {__name__="..."}
            matchers, index = _matchers(tokens, index)
            names = [v for label, op, v in matchers if label == "__name__" and op == "="]
            if len(names) != 1:
                raise ValueError(f"a selector without one metric name in {expr!r}")
            rest = tuple(m for m in matchers if m[0] != "__name__")
            found.selectors.append(Selector(names[0], rest))
        else:
            index += 1
    return found


def label_values(query: str) -> tuple[References, str]:
    """Grafana's ``label_values(SELECTOR, LABEL)``: the selector's references and the label."""
    match = re.fullmatch(r"\s*label_values\((.*),\s*([A-Za-z_]\w*)\s*\)\s*", query, re.DOTALL)
    if match is None:
        raise ValueError(f"not label_values(selector, label): {query!r}")
    return references(match.group(1)), match.group(2)
