"""A multi grader's `calculate_output` (`training/graders/formula.py`): OpenAI's operators and
functions evaluate as documented; anything else is refused before it runs, with what is allowed."""

from __future__ import annotations

import math

import pytest

from eft.training.graders.formula import MAX_EXPONENT, FormulaError, parse_formula

SCORES = {"a": 0.5, "b": 0.25, "big": 2000.0, "zero": 0.0}


@pytest.mark.parametrize("text, expected", [
    ("(a + b) / 2", 0.375), ("a - b * 2", 0.0), ("a ^ 2", 0.25), ("a ** 2", 0.25),
    ("1 + 2 * 3 ^ 2", 19.0), ("-2 ^ 2", -4.0), ("2 ^ 3 ^ 2", 512.0),  # power binds tightest, to the right
    ("-a + 1", 0.5), ("+b", 0.25), ("min(a, b)", 0.25), ("max(a, b, 0.9)", 0.9), ("min(a)", 0.5),
    ("abs(b - a)", 0.25), ("floor(a + 1.7)", 2.0), ("ceil(b)", 1.0), ("exp(zero)", 1.0), ("sqrt(b)", 0.5),
    ("log(exp(2))", 2.0), ("log(8, 2)", 3.0), ("0.5 * a + 0.5 * b", 0.375),
])
def test_documented_operators_and_functions(text, expected):
    formula = parse_formula(text, SCORES)
    value = formula.evaluate(SCORES)
    assert value == pytest.approx(expected) and isinstance(value, float)


def test_the_formula_knows_the_graders_it_reads():
    assert parse_formula("min(a, 1) + b", SCORES).names == {"a", "b"}


@pytest.mark.parametrize("text, says", [
    ("__import__('os').system('id')", "can only call min, max, abs, floor, ceil, exp, sqrt, log"),
    ("a.__class__", "attribute access is not allowed"),
    ("().__class__", "attribute access is not allowed"),
    ("a[0]", "(Subscript) is not allowed"),
    ("open('x')", "can only call"),
    ("c + 1", "`c` in calculate_output is not one of the graders (a, b, big, zero)"),
    ("min + 1", "`min` in calculate_output is not one of the graders"),
    ("a if b else 1", "(IfExp) is not allowed"),
    ("a < b", "(Compare) is not allowed"),
    ("a and b", "(BoolOp) is not allowed"),
    ("lambda: 1", "(Lambda) is not allowed"),
    ("[a for a in b]", "(ListComp) is not allowed"),
    ("'x' * 3", "`'x'` in calculate_output is not a number"),
    ("True + a", "is not a number"),
    ("a // b", "operator not allowed"),
    ("a ^^ b", "is not a formula"),
    ("~a", "operator not allowed"),
    ("min(a, key=b)", "pass the arguments of min by position"),
    ("max(*a)", "pass the arguments of max by position"),
    ("sqrt(a, b)", "sqrt takes 1 argument(s), not 2"),
    ("min()", "min takes 1 or more argument(s), not 0"),
    ("2 ** 100000", f"the exponent 100000 is over the bound of {MAX_EXPONENT:g}"),
    ("9 ^ 99999999", "over the bound"),
    ("a = 1", "is not a formula"),
    ("a +", "is not a formula"),
    ("  ", "calculate_output is empty"),
    ("a + " * 300 + "a", "characters; keep it under 1000"),
    ("+".join(["a"] * 150), "terms; keep it under 200"),
])
def test_anything_else_is_refused_with_what_is_allowed(text, says):
    with pytest.raises(FormulaError) as raised:
        parse_formula(text, SCORES)
    assert says in str(raised.value)


@pytest.mark.parametrize("text, says", [
    ("a / zero", "float division by zero"),
    ("a ^ big", "the exponent 2000 is over the bound"),
    ("exp(big)", "math range error"),
    ("10 ^ 1000", "Numerical result out of range"),
    ("sqrt(zero - a)", "math domain error"),
    ("log(zero)", "math domain error"),
    ("(zero - 8) ^ 0.5", "is not a real number"),
])
def test_a_value_that_is_not_a_finite_number_raises(text, says):
    formula = parse_formula(text, SCORES)
    with pytest.raises(FormulaError, match="calculate_output") as raised:
        formula.evaluate(SCORES)
    assert says in str(raised.value)


def test_arithmetic_is_in_floats_so_a_large_power_cannot_hang():
    formula = parse_formula("big ^ 1000", SCORES)  # 2000.0 ** 1000 overflows at once; an int would not
    with pytest.raises(FormulaError, match="out of range"):
        formula.evaluate(SCORES)
    assert math.isclose(parse_formula("2 ^ 1000", SCORES).evaluate(SCORES), 2.0 ** 1000)
