"""Compiler: a syntax tree to two Python functions, generated as source and compiled once.

``matches(data, meta=None) -> bool`` answers "is the filter TRUE for this message"; it
is the hot path of every subscription and queue. ``evaluate(data, meta=None)`` gives
the value (three-valued for predicates: True, False, None = UNKNOWN).

Rules kept here:
- Each predicate compiles three ways: *true* code (truthy iff the node is TRUE),
  *false* code (truthy iff it is FALSE) and *value* code. A filter only needs TRUE, so
  AND / OR become Python ``and`` / ``or`` over true code, and NOT asks its operand's
  false code: SQL three-valued logic without building UNKNOWN values at run time.
- Fast paths are inlined only where their answer is provably the one values.py gives:
  a ``dict`` body, a field compared with a literal when the field holds a ``str`` or
  a number. Every other case calls the helper of runtime.py that implements the rule.
- Generated code never embeds data from the filter except through ``repr`` of str,
  int and finite float constants; anything else is a named constant in the function's
  globals. Field names are therefore safe whatever characters they hold.
- The generated code nests at most a few parentheses per tree level, and the tree is
  at most limits.nesting_depth_max deep; long paths go through runtime.walk. If Python
  still refuses the code, the error is an ExpressionError, never a crash.
"""

from __future__ import annotations

import builtins
import math

from . import runtime, values
from .aggregates import AGGREGATES
from .errors import ExpressionError
from .functions import FUNCTIONS, SPECIAL_FORMS
from .limits import regex_class_chars_max, regex_count_max
from .nodes import (
    PREDICATES,
    Affix,
    And,
    Arith,
    Between,
    Call,
    Compare,
    Field,
    In,
    IsNull,
    Like,
    Literal,
    Node,
    Not,
    Or,
    Unary,
    walk,
)
from .regex import Pattern, compile_pattern, is_plain_text

_FLIP = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_PY_OP = {"=": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
_INLINE_PATH_STEPS_MAX = 4  # longer paths call runtime.walk (keeps generated code shallow)

# Helpers visible to generated code under these names.
_GLOBALS = {
    "__builtins__": {},
    "_as_mapping": runtime.as_mapping,
    "_step": runtime.step,
    "_index": runtime.index,
    "_walk": runtime.walk,
    "_result": runtime.result,
    "_cmp_t": runtime.cmp_true,
    "_cmp_f": runtime.cmp_false,
    "_cmp3": values.cmp3,
    "_like3": runtime.like3,
    "_affix3": runtime.affix3,
    "_between3": values.between3,
    "_in3": values.in3,
    "_is_null": values.is_null,
    "_truth": values.truth,
    "_not3": values.not3,
    "_any3": values.any3,
    "_all3": values.all3,
    "_sc": values.scalar,
    "_arith": values.arith,
    "_neg": values.negate,
    "_pos": values.plus,
    "_coalesce": runtime.coalesce,
    "list": list,
    "int": int,
    "float": float,
    "str": str,
    "dict": dict,
    "len": len,
}


def _is_plain_number(value: object) -> bool:
    return type(value) in (int, float) and not (type(value) is float and math.isnan(value))


class Compiled:
    """The output of ``compile_tree``: the two functions and the generated source."""

    def __init__(self, matches, evaluate, python: str) -> None:
        self.matches = matches
        self.evaluate = evaluate
        self.python = python


def compile_tree(tree: Node) -> Compiled:
    gen = _Codegen(tree)
    true_code = gen.true(tree)
    value_code = gen.value(tree)
    python = (
        "def matches(data, meta=None):\n"
        "    if data.__class__ is not dict:\n"
        "        data = _as_mapping(data)\n"
        f"    return True if {true_code} else False\n"
        "\n"
        "def evaluate(data, meta=None):\n"
        "    if data.__class__ is not dict:\n"
        "        data = _as_mapping(data)\n"
        f"    return _result({value_code})\n"
    )
    namespace = dict(_GLOBALS)
    namespace.update(gen.constants)
    try:
        code = builtins.compile(python, "<conveyor expression>", "exec")
        exec(code, namespace)
    except (SyntaxError, RecursionError, MemoryError, ValueError, OverflowError) as exc:
        raise ExpressionError(f"expression too complex to compile ({type(exc).__name__})", 0, "") from None
    return Compiled(namespace["matches"], namespace["evaluate"], python)


class _Codegen:
    def __init__(self, tree: Node) -> None:
        # LIKE patterns that need the regex engine share the expression's work budget.
        likes = [n for n in walk(tree) if isinstance(n, Like)]
        if len(likes) > regex_count_max:
            raise ExpressionError(f"more than {regex_count_max} LIKE operators", likes[regex_count_max].pos, "LIKE")
        self.regex_likes = sum(1 for n in likes if not is_plain_text(n.pattern))
        self.constants: dict[str, object] = {}
        self.counter = 0
        self.patterns: dict[int, tuple[str, Pattern]] = {}  # by id of the Like node
        self.class_chars_left = regex_class_chars_max  # shared by all LIKEs (limits.py)

    # --- names -----------------------------------------------------------------------

    def temp(self) -> str:
        self.counter += 1
        return f"_t{self.counter}"

    def const(self, value: object, stem: str = "") -> str:
        # "_k<n><stem>": no helper name starts with "_k", and temps are "_t<n>".
        self.counter += 1
        name = f"_k{self.counter}{stem.strip('_')}"
        self.constants[name] = value
        return name

    def literal(self, value: object) -> str:
        """Python text for a literal value (repr when exact and safe, else a named constant)."""
        if value is None or type(value) in (bool, int, str):
            return repr(value)
        if type(value) is float and math.isfinite(value):
            return repr(value)
        return self.const(value)

    # --- value code --------------------------------------------------------------------

    def value(self, node: Node) -> str:
        """Python expression for the node's value (three-valued for predicates)."""
        if isinstance(node, Literal):
            return self.literal(node.value)
        if isinstance(node, Field):
            return self.field(node)
        if isinstance(node, Unary):
            helper = "_neg" if node.op == "-" else "_pos"
            return f"{helper}({self.value(node.operand)})"
        if isinstance(node, Arith):
            return f"_arith({node.op!r}, {self.value(node.left)}, {self.value(node.right)})"
        if isinstance(node, Call):
            return self.call(node)
        if isinstance(node, Compare):
            return f"_cmp3({node.op!r}, {self.value(node.left)}, {self.value(node.right)})"
        if isinstance(node, And):
            return f"_all3(({', '.join(self.truth(t) for t in node.terms)},))"
        if isinstance(node, Or):
            return f"_any3(({', '.join(self.truth(t) for t in node.terms)},))"
        if isinstance(node, Not):
            return f"_not3({self.truth(node.operand)})"
        if isinstance(node, IsNull):
            code = f"_is_null({self.value(node.operand)})"
            return f"(not {code})" if node.negated else code
        if isinstance(node, Between):
            operand, low, high = (self.value(n) for n in (node.operand, node.low, node.high))
            return self.negate3(f"_between3({operand}, {low}, {high})", node.negated)
        if isinstance(node, In):
            literal_set = self.literal_set(node)
            if literal_set is not None:
                code = f"{literal_set}.value({self.value(node.operand)})"
            else:
                code = f"_in3({self.value(node.operand)}, {self.items(node.items)})"
            return self.negate3(code, node.negated)
        if isinstance(node, Like):
            name, _pattern = self.pattern(node)
            return self.negate3(f"_like3({name}, {self.value(node.operand)})", node.negated)
        if isinstance(node, Affix):
            code = f"_affix3({node.kind!r}, {self.value(node.operand)}, {self.items(node.items)})"
            return self.negate3(code, node.negated)
        raise AssertionError(f"unknown node {node!r}")

    @staticmethod
    def negate3(code: str, negated: bool) -> str:
        return f"_not3({code})" if negated else code

    def items(self, nodes: tuple[Node, ...]) -> str:
        return "(" + ", ".join(self.value(n) for n in nodes) + ",)"

    def truth(self, node: Node) -> str:
        """Three-valued truth of any node (predicates already are)."""
        code = self.value(node)
        return code if isinstance(node, PREDICATES) else f"_truth({code})"

    def field(self, node: Field) -> str:
        steps = node.steps
        if len(steps) > _INLINE_PATH_STEPS_MAX:
            return f"_walk(data, {self.const(steps)})"
        code = f"data.get({steps[0]!r})"
        for s in steps[1:]:
            if type(s) is int:
                code = f"_index({code}, {s})"
            else:
                t = self.temp()
                code = f"({t}.get({s!r}) if ({t} := {code}).__class__ is dict else _step({t}, {s!r}))"
        return code

    def scalar_arg(self, node: Node) -> str:
        """A function argument: a scalar (spec 8: the first element of an array).

        Only fields can hold arrays, objects or ''; every other node already gives a
        scalar (functions never return '').
        """
        code = self.value(node)
        return f"_sc({code})" if isinstance(node, Field) else code

    def call(self, node: Call) -> str:
        name = node.name
        if name in SPECIAL_FORMS:
            self.check_arity(node, *SPECIAL_FORMS[name])
            if name == "IF":
                # Only the branch that is needed is evaluated (AMPS 5.3.4 and later).
                # A condition that is FALSE or UNKNOWN picks the second value.
                cond, yes, no = node.args
                return f"({self.scalar_arg(yes)} if {self.true(cond)} else {self.scalar_arg(no)})"
            # COALESCE evaluates its arguments eagerly: functions are side-effect free
            # and spec 5.1 does not promise short-circuiting.
            return f"_coalesce({', '.join(self.scalar_arg(a) for a in node.args)})"
        function = FUNCTIONS.get(name)
        if function is None:
            if name in AGGREGATES:
                raise ExpressionError(
                    f"aggregate function {name} is allowed only in the projection of a view or an "
                    "aggregated subscription", node.pos, name,
                )
            raise ExpressionError(f"unknown function '{name}'", node.pos, name)
        self.check_arity(node, function.args_min, function.args_max)
        args = [self.scalar_arg(a) for a in node.args]
        if function.needs_meta:
            args.insert(0, "meta")
        return f"{self.const(function.impl, '_f')}({', '.join(args)})"

    @staticmethod
    def check_arity(node: Call, least: int, most: int | None) -> None:
        n = len(node.args)
        if n >= least and (most is None or n <= most):
            return
        if most is None:
            wanted = f"at least {least}"
        elif least == most:
            wanted = str(least)
        else:
            wanted = f"{least} to {most}"
        plural = "" if wanted == "1" else "s"
        raise ExpressionError(f"{node.name} takes {wanted} argument{plural}, not {n}", node.pos, node.name)

    def pattern(self, node: Like) -> tuple[str, Pattern]:
        """The compiled pattern of a LIKE node, as (constant name, Pattern): once per node."""
        known = self.patterns.get(id(node))
        if known is not None:
            return known
        pattern = compile_pattern(node.pattern, node.pattern_pos, self.class_chars_left, self.regex_likes)
        self.class_chars_left -= pattern.class_chars
        entry = (self.const(pattern, "_p"), pattern)
        self.patterns[id(node)] = entry
        return entry

    def literal_set(self, node: In) -> str | None:
        if not all(isinstance(i, Literal) for i in node.items):
            return None
        return self.const(runtime.LiteralSet([i.value for i in node.items]), "_in")

    # --- true / false code ------------------------------------------------------------------

    def true(self, node: Node) -> str:
        """Python expression, truthy iff the node is TRUE."""
        return self.truth_code(node, True)

    def truth_code(self, node: Node, want: bool) -> str:
        """Python expression, truthy iff the node is TRUE (want) or FALSE (not want)."""
        if isinstance(node, And):
            joiner = " and " if want else " or "
            return "(" + joiner.join(self.truth_code(t, want) for t in node.terms) + ")"
        if isinstance(node, Or):
            joiner = " or " if want else " and "
            return "(" + joiner.join(self.truth_code(t, want) for t in node.terms) + ")"
        if isinstance(node, Not):
            return self.truth_code(node.operand, not want)
        if isinstance(node, Compare):
            return self.compare(node, want)
        if isinstance(node, IsNull):
            code = f"_is_null({self.value(node.operand)})"
            return code if want != node.negated else f"(not {code})"
        if isinstance(node, Between):
            return self.between(node, want != node.negated)
        if isinstance(node, In):
            want = want != node.negated
            literal_set = self.literal_set(node)
            if literal_set is not None:
                return f"{literal_set}.{'true' if want else 'false'}({self.value(node.operand)})"
            return f"(_in3({self.value(node.operand)}, {self.items(node.items)}) is {want})"
        if isinstance(node, Like):
            return self.like(node, want != node.negated)
        if isinstance(node, Affix):
            return self.affix(node, want != node.negated)
        if isinstance(node, Literal):
            return repr(values.truth(node.value) is want)
        return f"(_truth({self.value(node)}) is {want})"

    def compare(self, node: Compare, want: bool) -> str:
        op, left, right = node.op, node.left, node.right
        helper = "_cmp_t" if want else "_cmp_f"
        if isinstance(left, Literal) and isinstance(right, Literal):
            return repr(values.cmp3(op, left.value, right.value) is want)
        if isinstance(left, Literal):
            op, left, right = _FLIP[op], right, left
        if not isinstance(right, Literal):
            return f"{helper}({op!r}, {self.value(left)}, {self.value(right)})"
        lit = right.value
        if lit is None:
            return "False"  # NULL compares UNKNOWN: never TRUE, never FALSE
        operand = self.value(left)
        lit_code = self.literal(lit)
        t = self.temp()
        slow = f"{helper}({op!r}, {t}, {lit_code})"
        py = _PY_OP[op]
        if _is_plain_number(lit):
            # A number against a number: Python's comparison is the rule, except that a
            # NaN makes != FALSE too. Two numbers are never UNKNOWN: FALSE is not TRUE.
            k = self.temp()
            is_number = f"({k} := ({t} := {operand}).__class__) is int or {k} is float"
            true = f"({t} != {lit_code} and {t} == {t})" if op == "!=" else f"{t} {py} {lit_code}"
            fast = true if want else f"not ({true})"
            return f"({fast} if {is_number} else {slow})"
        if type(lit) is str:
            # A str field against a str: compared as strings; '' is NULL.
            if want and op == "=":
                # Equal str: TRUE at once. Otherwise only an array (or, for numeric
                # text, a number) can still be equal.
                other = "is not str" if values.parse_number(lit) is not None else "is list"
                return f"(({t} := {operand}) == {lit_code} or {t}.__class__ {other} and {slow})"
            test = f"{t} {py} {lit_code}" if want else f"not {t} {py} {lit_code}"
            return f"({test} and {t} != '' if ({t} := {operand}).__class__ is str else {slow})"
        return f"{helper}({op!r}, {operand}, {lit_code})"

    def between(self, node: Between, want: bool) -> str:
        operand = self.value(node.operand)
        low, high = node.low, node.high
        bounds = f"{self.value(low)}, {self.value(high)}"
        plain = (
            isinstance(low, Literal)
            and isinstance(high, Literal)
            and _is_plain_number(low.value)
            and _is_plain_number(high.value)
        )
        if not plain:
            return f"(_between3({operand}, {bounds}) is {want})"
        t, k = self.temp(), self.temp()
        lo, hi = self.literal(low.value), self.literal(high.value)
        is_number = f"({k} := ({t} := {operand}).__class__) is int or {k} is float"
        fast = f"{lo} <= {t} <= {hi}" if want else f"not ({lo} <= {t} <= {hi})"  # NaN: FALSE
        return f"({fast} if {is_number} else _between3({t}, {bounds}) is {want})"

    def like(self, node: Like, want: bool) -> str:
        name, pattern = self.pattern(node)
        operand = self.value(node.operand)
        if pattern.kind != "regex" and not pattern.text:
            return f"(_like3({name}, {operand}) is {want})"
        t = self.temp()
        if pattern.kind == "regex":
            search = self.const(pattern.search, "_rx")
            found = "is not None" if want else "is None"
            # A str longer than the pattern's subject limit is UNKNOWN: neither branch.
            fast = f"0 < len({t}) <= {pattern.subject_chars_max} and {search}({t}) {found}"
        else:
            text = repr(pattern.text)
            text_nl = repr(pattern.text + "\n")  # "$" also matches before a final newline
            test = {
                "prefix": f"{t}.startswith({text})",
                "suffix": f"({t}.endswith({text}) or {t}.endswith({text_nl}))",
                "suffix_z": f"{t}.endswith({text})",
                "exact": f"({t} == {text} or {t} == {text_nl})",
                "exact_z": f"{t} == {text}",
                "contains": f"{text} in {t}",
            }[pattern.kind]
            fast = test if want else f"(not {test} and {t} != '')"
        return f"({fast} if ({t} := {operand}).__class__ is str else _like3({name}, {t}) is {want})"

    def affix(self, node: Affix, want: bool) -> str:
        operand = self.value(node.operand)
        texts = None
        if all(isinstance(i, Literal) for i in node.items):
            texts = tuple(values.to_text(i.value) for i in node.items)
        if texts is None or None in texts:
            # Expressions, or a NULL item (which turns "no match" into UNKNOWN).
            return f"(_affix3({node.kind!r}, {operand}, {self.items(node.items)}) is {want})"
        t = self.temp()
        texts_code = self.const(texts, "_s")
        method = "startswith" if node.kind == "BEGINS" else "endswith"
        test = f"{t}.{method}({texts_code})"
        fast = test if want else f"(not {test} and {t} != '')"
        slow = f"_affix3({node.kind!r}, {t}, {texts_code}) is {want}"
        return f"({fast} if ({t} := {operand}).__class__ is str else {slow})"
