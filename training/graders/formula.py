"""A multi grader's `calculate_output`: a small arithmetic formula over its graders' scores.

OpenAI's graders guide, "Multigraders": the formula names the keys of `graders` and supports the
operators `+ - * / ^` (`^` is power) and the functions `min`, `max`, `abs`, `floor`, `ceil`,
`exp`, `sqrt`, `log`, e.g. `"(name + email) / 2"` or `"0.5 * function_name + 0.5 * arguments"`.

This evaluator parses the formula with Python's `ast` and walks the tree itself, so nothing is
ever executed: it accepts numbers, grader names, `+ - * /`, `^` and `**` (both power, binding
tighter than `*` and grouping to the right, as in mathematics: `2 ^ 3 ^ 2` is 512), unary
`-`/`+`, parentheses and calls of those eight functions (`min`/`max` take one or more arguments,
`log` an optional base); anything else (attribute access, subscripts, comparisons, other names
or calls, keyword arguments) is refused with a message naming it. Arithmetic is in floats, a
power's exponent is bounded by `MAX_EXPONENT`, and the formula by `MAX_FORMULA_CHARS` characters
and `MAX_NODES` syntax nodes. A result that is not a finite number (division by zero, `log(0)`,
overflow) raises FormulaError.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from typing import Callable, Collection, Mapping

MAX_FORMULA_CHARS = 1000
MAX_NODES = 200
MAX_EXPONENT = 1024.0

#: name -> (function, least arguments, most arguments or None for any number)
FUNCTIONS: dict[str, tuple[Callable[..., float], int, int | None]] = {
    "min": (lambda *values: min(values), 1, None), "max": (lambda *values: max(values), 1, None), "abs": (abs, 1, 1),
    "floor": (math.floor, 1, 1), "ceil": (math.ceil, 1, 1), "exp": (math.exp, 1, 1),
    "sqrt": (math.sqrt, 1, 1), "log": (math.log, 1, 2),
}
_ALLOWED = ("numbers, grader names, + - * / ^, parentheses and the functions "
            + ", ".join(FUNCTIONS))
_BINARY: dict[type, Callable[[float, float], float]] = {
    ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b, ast.Pow: lambda a, b: _power(a, b),
}


class FormulaError(ValueError):
    """A formula that cannot be parsed or evaluated; the message says why and what is allowed."""


@dataclass(frozen=True)
class Formula:
    text: str
    tree: ast.expr
    #: The grader names the formula reads.
    names: frozenset[str]

    def evaluate(self, scores: Mapping[str, float]) -> float:
        """The formula's value for the graders' scores. Raises FormulaError when it is not a
        finite number."""
        try:
            value = _evaluate(self.tree, scores)
        except (ArithmeticError, ValueError) as error:  # ZeroDivisionError, OverflowError, math domain
            raise FormulaError(f"calculate_output `{self.text}` failed: {error}") from None
        if not math.isfinite(value):
            raise FormulaError(f"calculate_output `{self.text}` is {value}, not a finite number")
        return float(value)


def parse_formula(text: str, names: Collection[str]) -> Formula:
    """The parsed formula over the grader names `names`. Raises FormulaError naming what is
    not allowed."""
    if not text.strip():
        raise FormulaError(f"calculate_output is empty; write a formula over the graders ({_list(names)})")
    if len(text) > MAX_FORMULA_CHARS:
        raise FormulaError(f"calculate_output has {len(text)} characters; keep it under {MAX_FORMULA_CHARS}")
    source = _python_syntax(text)
    try:
        tree = ast.parse(source, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        detail = getattr(error, "msg", None) or str(error)
        raise FormulaError(f"calculate_output `{text}` is not a formula: {detail}") from None
    nodes = list(ast.walk(tree))
    if len(nodes) > MAX_NODES:
        raise FormulaError(f"calculate_output has {len(nodes)} terms; keep it under {MAX_NODES}")
    called = {id(node.func) for node in nodes if isinstance(node, ast.Call)}
    used: set[str] = set()
    for node in nodes:
        if id(node) not in called:  # a called name is checked with its call
            _check_node(node, source, names, used)
    return Formula(text, tree, frozenset(used))


def _python_syntax(text: str) -> str:
    """The formula in Python's syntax: `^` is power, binding tighter than `*` and to the right
    (`2 ^ 3 ^ 2` is 512), as `**` does (Python's `^` is a bitwise operator below `+`)."""
    return text.strip().replace("^", "**")


def _check_node(node: ast.AST, source: str, names: Collection[str], used: set[str]) -> None:
    snippet = ast.get_source_segment(source, node) or type(node).__name__
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise FormulaError(f"`{snippet}` in calculate_output is not a number; allowed: {_ALLOWED}")
    elif isinstance(node, ast.Name):
        if node.id not in names:
            raise FormulaError(f"`{node.id}` in calculate_output is not one of the graders ({_list(names)})")
        used.add(node.id)
    elif isinstance(node, ast.Call):
        _check_call(node, snippet)
    elif isinstance(node, ast.Attribute):
        raise FormulaError(f"`{snippet}`: attribute access is not allowed in calculate_output; allowed: {_ALLOWED}")
    elif isinstance(node, ast.BinOp):
        if type(node.op) not in _BINARY:
            raise FormulaError(f"`{snippet}`: operator not allowed in calculate_output; allowed: {_ALLOWED}")
        if isinstance(node.op, ast.Pow) and isinstance(node.right, ast.Constant) \
                and isinstance(node.right.value, (int, float)) and abs(node.right.value) > MAX_EXPONENT:
            raise FormulaError(f"`{snippet}`: the exponent {node.right.value} is over the bound of {MAX_EXPONENT:g}")
    elif isinstance(node, ast.UnaryOp):
        if not isinstance(node.op, (ast.USub, ast.UAdd)):
            raise FormulaError(f"`{snippet}`: operator not allowed in calculate_output; allowed: {_ALLOWED}")
    elif not isinstance(node, (ast.operator, ast.unaryop, ast.Load)):
        raise FormulaError(f"`{snippet}` ({type(node).__name__}) is not allowed in calculate_output; "
                           f"allowed: {_ALLOWED}")


def _check_call(node: ast.Call, snippet: str) -> None:
    if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
        raise FormulaError(f"`{snippet}`: calculate_output can only call {', '.join(FUNCTIONS)}")
    if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
        raise FormulaError(f"`{snippet}`: pass the arguments of {node.func.id} by position")
    _, least, most = FUNCTIONS[node.func.id]
    if len(node.args) < least or (most is not None and len(node.args) > most):
        wanted = f"{least}" if least == most else f"{least} to {most}" if most else f"{least} or more"
        raise FormulaError(f"`{snippet}`: {node.func.id} takes {wanted} argument(s), not {len(node.args)}")


def _evaluate(node: ast.expr, scores: Mapping[str, float]) -> float:
    if isinstance(node, ast.Constant):
        return float(node.value)
    if isinstance(node, ast.Name):
        return float(scores[node.id])
    if isinstance(node, ast.UnaryOp):
        value = _evaluate(node.operand, scores)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        return _BINARY[type(node.op)](_evaluate(node.left, scores), _evaluate(node.right, scores))
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    return float(FUNCTIONS[node.func.id][0](*(_evaluate(a, scores) for a in node.args)))


def _power(base: float, exponent: float) -> float:
    if abs(exponent) > MAX_EXPONENT:
        raise ValueError(f"the exponent {exponent:g} is over the bound of {MAX_EXPONENT:g}")
    result = base ** exponent
    if isinstance(result, complex):
        raise ValueError(f"{base:g} ^ {exponent:g} is not a real number")
    return result


def _list(names: Collection[str]) -> str:
    return ", ".join(sorted(names)) or "none"
