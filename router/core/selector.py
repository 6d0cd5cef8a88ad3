"""JMS message selectors (``apache.org:selector-filter:string``), parsed with lark
and compiled to Python closures (docs/selectors.md).

The language is JMS 2.0's (section 3.8.1), a subset of SQL-92 conditional
expressions over a message's header fields and properties: comparisons
(``= <> < > <= >=``), ``AND OR NOT``, ``+ - * /``, ``[NOT] BETWEEN``, ``[NOT] IN``
(string literals), ``[NOT] LIKE`` with ``%``/``_`` and ``ESCAPE``, ``IS [NOT] NULL``,
string, exact and approximate numeric and boolean literals. Keywords are
case-insensitive, identifiers are not.

Values are None (a missing property: SQL's "unknown"), bool, int, float or str.
Three-valued logic as JMS defines it: a comparison, arithmetic, BETWEEN, IN or LIKE
with an unknown operand is unknown; ``AND``/``OR``/``NOT`` follow SQL's truth
tables; a message is selected only when the whole expression is true. Comparing
values of unlike types (a string with a number, a boolean with a string) is false,
strings and booleans compare only with ``=``/``<>``, arithmetic on anything but
numbers is unknown, and so is a division by zero; exact numbers divide as Java's
longs do (truncating towards zero). Pure: no proton, no sockets.
"""

from __future__ import annotations

import functools
import math
import operator
import re
from collections.abc import Callable, Mapping

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedInput, VisitError

#: The filter's descriptor (the registry's symbol; its code is 0x0000468C:0x00000004).
SELECTOR_FILTER = "apache.org:selector-filter:string"
SELECTOR_CODE = 0x0000468C00000004

Value = bool | int | float | str | None
Env = Mapping[str, Value]
Expr = Callable[[Env], Value]
Test = Callable[[Env], bool]
ValuesTest = Callable[[tuple[Value, ...]], bool]

_GRAMMAR = r"""
?start: or_expr
?or_expr: and_expr | or_expr _OR and_expr -> or_
?and_expr: not_expr | and_expr _AND not_expr -> and_
?not_expr: predicate | _NOT not_expr -> not_
?predicate: sum
    | sum COMPOP sum -> compare
    | sum _BETWEEN sum _AND sum -> between
    | sum _NOT _BETWEEN sum _AND sum -> not_between
    | sum _LIKE STRING [_ESCAPE STRING] -> like
    | sum _NOT _LIKE STRING [_ESCAPE STRING] -> not_like
    | sum _IN "(" STRING ("," STRING)* ")" -> in_
    | sum _NOT _IN "(" STRING ("," STRING)* ")" -> not_in
    | sum _IS _NULL -> is_null
    | sum _IS _NOT _NULL -> is_not_null
?sum: product | sum ADDOP product -> arith
?product: unary | product MULOP unary -> arith
?unary: atom | ADDOP unary -> sign
?atom: NUMBER -> number
    | STRING -> string
    | _TRUE -> true
    | _FALSE -> false
    | IDENT -> ident
    | "(" or_expr ")"

_OR: "OR"i
_AND: "AND"i
_NOT: "NOT"i
_BETWEEN: "BETWEEN"i
_LIKE: "LIKE"i
_ESCAPE: "ESCAPE"i
_IN: "IN"i
_IS: "IS"i
_NULL: "NULL"i
_TRUE: "TRUE"i
_FALSE: "FALSE"i
COMPOP: "<>" | "<=" | ">=" | "=" | "<" | ">"
ADDOP: "+" | "-"
MULOP: "*" | "/"
NUMBER: /(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?/
STRING: /'([^']|'')*'/
IDENT: /[A-Za-z_$][A-Za-z0-9_$.]*/
%ignore /[ \t\r\n]+/
"""


@functools.cache
def _parser() -> Lark:
    """The LALR parser, built at the first selector (a router whose subscribers use
    none never pays the ~35 ms of building it at start)."""
    return Lark(_GRAMMAR, parser="lalr", maybe_placeholders=True)


_KEYWORDS = {"OR", "AND", "NOT", "BETWEEN", "LIKE", "ESCAPE", "IN", "IS", "NULL", "TRUE", "FALSE"}
#: LinkAttached.selector of a selector filter whose value is not a string: this
#: prefix, then its repr (the core refuses it, naming it).
NOT_A_STRING = "\x00"
MAX_SELECTOR_LENGTH = 4096  # characters: a selector is evaluated once per message at this router


class SelectorError(ValueError):
    """A selector that does not parse: ``position`` is its 1-based column."""

    def __init__(self, message: str, position: int | None = None):
        super().__init__(message)
        self.position = position


# ------------------------------------------------------------------ three-valued logic


def is_number(v: Value) -> bool:
    return (type(v) is int) or (type(v) is float)


def truth(v: Value) -> bool | None:
    """A value as a condition: booleans are themselves, anything else is unknown."""
    return v if type(v) is bool else None


def and3(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    if a is True and b is True:
        return True
    return None


def or3(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    if a is False and b is False:
        return False
    return None


def not3(a: bool | None) -> bool | None:
    return None if a is None else not a


_ORDER = {"<": operator.lt, ">": operator.gt, "<=": operator.le, ">=": operator.ge}


def compare(op: str, a: Value, b: Value) -> bool | None:
    if a is None or b is None:
        return None
    if is_number(a) and is_number(b):
        if op == "=":
            return a == b
        if op == "<>":
            return a != b
        return bool(_ORDER[op](a, b))
    if type(a) is type(b) and type(a) in (str, bool):  # like types: only = and <> compare them
        if op == "=":
            return a == b
        if op == "<>":
            return a != b
    return False  # unlike types, or an ordering of strings or booleans


def arith(op: str, a: Value, b: Value) -> Value:
    if not (is_number(a) and is_number(b)):
        return None
    assert isinstance(a, (int, float)) and isinstance(b, (int, float))
    try:
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if b == 0:
            return None
        if type(a) is int and type(b) is int:
            q = abs(a) // abs(b)
            return q if (a >= 0) == (b >= 0) else -q
        r = a / b
    except OverflowError:
        # An integer too large for a float met a float (a subscriber's literal of
        # hundreds of digits): no value, as for a division by zero, never an error
        # that would stop the router's work on the message for everyone.
        return None
    return r if math.isfinite(r) else None


def like_regex(pattern: str, escape: str | None) -> re.Pattern[str]:
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if escape is not None and c == escape and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if c == "%" else "." if c == "_" else re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL)


# ------------------------------------------------------------------ compiling


def _unquote(token: Token) -> str:
    return str(token)[1:-1].replace("''", "'")


@v_args(inline=True)
class _Compile(Transformer[Token, Expr]):
    """Each node becomes a closure over the message's environment (name -> value)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()  # the identifiers it reads

    def number(self, tok: Token) -> Expr:
        text = str(tok)
        value: Value = float(text) if any(c in text for c in ".eE") else int(text)
        return lambda env: value

    def string(self, tok: Token) -> Expr:
        value = _unquote(tok)
        return lambda env: value

    def true(self) -> Expr:
        return lambda env: True

    def false(self) -> Expr:
        return lambda env: False

    def ident(self, tok: Token) -> Expr:
        name = str(tok)
        if name.upper() in _KEYWORDS:
            raise SelectorError(f"{name!r} is a keyword, not a property name", tok.column)
        self.names.add(name)
        return lambda env: env.get(name)

    def sign(self, op: Token, x: Expr) -> Expr:
        if str(op) == "+":
            return lambda env: v if is_number(v := x(env)) else None
        return lambda env: -v if is_number(v := x(env)) else None  # type: ignore[operator]

    def arith(self, a: Expr, op: Token, b: Expr) -> Expr:
        o = str(op)
        return lambda env: arith(o, a(env), b(env))

    def compare(self, a: Expr, op: Token, b: Expr) -> Expr:
        o = str(op)
        return lambda env: compare(o, a(env), b(env))

    def between(self, x: Expr, lo: Expr, hi: Expr) -> Expr:
        def run(env: Env) -> Value:
            v = x(env)
            return and3(compare(">=", v, lo(env)), compare("<=", v, hi(env)))

        return run

    def not_between(self, x: Expr, lo: Expr, hi: Expr) -> Expr:
        inner = self.between(x, lo, hi)
        return lambda env: not3(truth(inner(env)))

    def like(self, x: Expr, pattern: Token, escape: Token | None) -> Expr:
        esc = _unquote(escape) if escape is not None else None
        if esc is not None and len(esc) != 1:
            raise SelectorError(f"ESCAPE takes one character, found {esc!r}", escape.column if escape is not None else None)
        regex = like_regex(_unquote(pattern), esc)

        def run(env: Env) -> Value:
            v = x(env)
            if v is None:
                return None
            return type(v) is str and regex.fullmatch(v) is not None

        return run

    def not_like(self, x: Expr, pattern: Token, escape: Token | None) -> Expr:
        inner = self.like(x, pattern, escape)
        return lambda env: not3(truth(inner(env)))

    def in_(self, x: Expr, *items: Token) -> Expr:
        values = frozenset(_unquote(t) for t in items)

        def run(env: Env) -> Value:
            v = x(env)
            if v is None:
                return None
            return type(v) is str and v in values

        return run

    def not_in(self, x: Expr, *items: Token) -> Expr:
        inner = self.in_(x, *items)
        return lambda env: not3(truth(inner(env)))

    def is_null(self, x: Expr) -> Expr:
        return lambda env: x(env) is None

    def is_not_null(self, x: Expr) -> Expr:
        return lambda env: x(env) is not None

    def and_(self, a: Expr, b: Expr) -> Expr:
        def run(env: Env) -> Value:
            left = truth(a(env))
            if left is False:
                return False
            return and3(left, truth(b(env)))

        return run

    def or_(self, a: Expr, b: Expr) -> Expr:
        def run(env: Env) -> Value:
            left = truth(a(env))
            if left is True:
                return True
            return or3(left, truth(b(env)))

        return run

    def not_(self, a: Expr) -> Expr:
        return lambda env: not3(truth(a(env)))


# ------------------------------------------------------------------ generating the test


def _sign(op: str, v: Value) -> Value:
    return (v if op == "+" else -v) if is_number(v) else None  # type: ignore[operator]


def _between(v: Value, lo: Value, hi: Value) -> Value:
    return and3(compare(">=", v, lo), compare("<=", v, hi))


def _like(regex: re.Pattern[str], v: Value) -> Value:
    return None if v is None else (type(v) is str and regex.fullmatch(v) is not None)


def _in(values: frozenset[str], v: Value) -> Value:
    return None if v is None else (type(v) is str and v in values)


_HELPERS = {
    "truth": truth,
    "and3": and3,
    "or3": or3,
    "not3": not3,
    "compare": compare,
    "arith": arith,
    "_sign": _sign,
    "_between": _between,
    "_like": _like,
    "_in": _in,
}
_PYTHON_OPS = {"=": "==", "<>": "!=", "<": "<", ">": ">", "<=": "<=", ">=": ">="}
_NO_LITERAL = object()
_NUMBER_TEST = "(type({v}) is int or type({v}) is float)"


class _Code:
    """One node of a selector as Python source. ``value`` computes its three-valued
    value as the node's closure does; ``true`` and ``false`` are boolean expressions
    equal to ``value is True`` and ``value is False``, written without making the
    value where the node allows it (a comparison of a property with a literal,
    AND/OR/NOT, IN, LIKE, IS NULL, BETWEEN two numbers): a message is selected when
    the whole selector's ``true`` holds, and most selectors are such nodes."""

    __slots__ = ("value", "true", "false", "local", "literal")

    def __init__(
        self, value: str, true: str = "", false: str = "", local: str | None = None, literal: object = _NO_LITERAL
    ) -> None:
        self.value = value
        self.true = true or f"(({value}) is True)"
        self.false = false or f"(({value}) is False)"
        self.local = local  # the local variable holding a property's value (an identifier)
        self.literal = literal  # the constant's value (a literal)


@v_args(inline=True)
class _Source(Transformer[Token, _Code]):
    """The selector as one Python function of the environment: each property read
    once into a local, the rest inline (no call per node, as the closures make)."""

    def __init__(self) -> None:
        super().__init__()
        self.locals: dict[str, str] = {}  # property name -> its local variable
        self.constants: dict[str, object] = {}  # values the source names (regexes, sets, floats)
        self.temporaries = 0

    def _constant(self, value: object) -> str:
        if type(value) in (str, int, bool):
            return repr(value)
        name = f"_k{len(self.constants)}"
        self.constants[name] = value
        return name

    def _literal(self, value: Value) -> _Code:
        if value is None:  # (unknown: not a literal the comparisons below may specialize on)
            return _Code("None", "False", "False")
        if type(value) is bool:
            return _Code(repr(value), repr(value), repr(not value), literal=value)
        return _Code(self._constant(value), "False", "False", literal=value)

    def functions(self, body: str) -> str:
        """``_selects(env)``, and ``_selects_values(values)``: the same test of the
        values of the names it reads, in their sorted order (a tuple: no dict)."""
        reads = "".join(f"    {local} = env.get({name!r})\n" for name, local in self.locals.items())
        unpack = "".join(f"{self.locals[name]}, " for name in sorted(self.locals))
        unpack_line = f"    {unpack}= values\n" if unpack else ""
        return f"def _selects(env):\n{reads}    return {body}\n\ndef _selects_values(values):\n{unpack_line}    return {body}\n"

    def number(self, tok: Token) -> _Code:
        text = str(tok)
        return self._literal(float(text) if any(c in text for c in ".eE") else int(text))

    def string(self, tok: Token) -> _Code:
        return self._literal(_unquote(tok))

    def true(self) -> _Code:
        return self._literal(True)

    def false(self) -> _Code:
        return self._literal(False)

    def ident(self, tok: Token) -> _Code:
        local = self.locals.setdefault(str(tok), f"v{len(self.locals)}")
        return _Code(local, f"({local} is True)", f"({local} is False)", local=local)

    def sign(self, op: Token, x: _Code) -> _Code:
        if is_number(x.literal):  # type: ignore[arg-type]  # a negative number: a literal too
            return self._literal(_sign(str(op), x.literal))  # type: ignore[arg-type]
        return _Code(f"_sign({str(op)!r}, {x.value})")

    def arith(self, a: _Code, op: Token, b: _Code) -> _Code:
        return _Code(f"arith({str(op)!r}, {a.value}, {b.value})")

    def compare(self, a: _Code, op: Token, b: _Code) -> _Code:
        o = str(op)
        general = _Code(f"compare({o!r}, {a.value}, {b.value})")
        if a.literal is not _NO_LITERAL and b.literal is not _NO_LITERAL:
            return self._literal(compare(o, a.literal, b.literal))  # type: ignore[arg-type]
        literal = a.literal if a.literal is not _NO_LITERAL else b.literal
        local = b.local if a.literal is not _NO_LITERAL else a.local
        if literal is _NO_LITERAL or local is None:
            return general
        if type(literal) is str and o == "=":  # (a value of another type is never equal to a string)
            yes = f"({a.value} == {b.value})"
        elif type(literal) is bool and o == "=":  # (but 1 == True: the booleans by identity)
            yes = f"({local} is {literal!r})"
        elif type(literal) in (str, bool):  # like types compare with = and <> only, unlike ones are false
            kind = type(literal).__name__
            yes = f"(type({local}) is {kind} and {a.value} != {b.value})" if o == "<>" else "False"
        else:
            yes = f"({_NUMBER_TEST.format(v=local)} and {a.value} {_PYTHON_OPS[o]} {b.value})"
        return _Code(general.value, yes, f"({local} is not None and not {yes})")

    def between(self, x: _Code, lo: _Code, hi: _Code) -> _Code:
        general = _Code(f"_between({x.value}, {lo.value}, {hi.value})")
        if x.local is None or not (is_number(lo.literal) and is_number(hi.literal)):  # type: ignore[arg-type]
            return general
        yes = f"({_NUMBER_TEST.format(v=x.local)} and {lo.value} <= {x.local} <= {hi.value})"
        return _Code(general.value, yes, f"({x.local} is not None and not {yes})")

    def not_between(self, x: _Code, lo: _Code, hi: _Code) -> _Code:
        return self.not_(self.between(x, lo, hi))

    def like(self, x: _Code, pattern: Token, escape: Token | None) -> _Code:
        regex = self._constant(like_regex(_unquote(pattern), _unquote(escape) if escape is not None else None))
        return self._string_test(x, f"_like({regex}, {x.value})", f"{regex}.fullmatch({{v}}) is not None")

    def not_like(self, x: _Code, pattern: Token, escape: Token | None) -> _Code:
        return self.not_(self.like(x, pattern, escape))

    def in_(self, x: _Code, *items: Token) -> _Code:
        values = self._constant(frozenset(_unquote(t) for t in items))
        return self._string_test(x, f"_in({values}, {x.value})", f"{{v}} in {values}")

    def not_in(self, x: _Code, *items: Token) -> _Code:
        return self.not_(self.in_(x, *items))

    def _string_test(self, x: _Code, value: str, test: str) -> _Code:
        """LIKE and IN: unknown for a missing property, false for one not a string."""
        if x.local is None:
            return _Code(value)
        yes = f"(type({x.local}) is str and {test.format(v=x.local)})"
        return _Code(value, yes, f"({x.local} is not None and not {yes})")

    def is_null(self, x: _Code) -> _Code:
        if x.literal is not _NO_LITERAL:  # (a literal is never null: no `'x' is None` in the source)
            return self._literal(False)
        return _Code(f"(({x.value}) is None)", f"(({x.value}) is None)", f"(({x.value}) is not None)")

    def is_not_null(self, x: _Code) -> _Code:
        if x.literal is not _NO_LITERAL:
            return self._literal(True)
        return _Code(f"(({x.value}) is not None)", f"(({x.value}) is not None)", f"(({x.value}) is None)")

    def _temporary(self) -> str:
        self.temporaries += 1
        return f"t{self.temporaries}"

    def and_(self, a: _Code, b: _Code) -> _Code:
        t = self._temporary()
        value = f"(False if ({t} := truth({a.value})) is False else and3({t}, truth({b.value})))"
        return _Code(value, f"({a.true} and {b.true})", f"({a.false} or {b.false})")

    def or_(self, a: _Code, b: _Code) -> _Code:
        t = self._temporary()
        value = f"(True if ({t} := truth({a.value})) is True else or3({t}, truth({b.value})))"
        return _Code(value, f"({a.true} or {b.true})", f"({a.false} and {b.false})")

    def not_(self, a: _Code) -> _Code:
        return _Code(f"not3(truth({a.value}))", a.false, a.true)


def _generated_tests(tree: Tree[Token]) -> tuple[Test, ValuesTest] | None:
    """``selects`` and ``selects_values`` as generated functions (~5x faster than the
    closures on a simple selector); None when Python cannot compile them (a selector
    nested deeper than its parser allows): the closures answer then."""
    source = _Source()
    try:
        body = source.transform(tree)
        namespace: dict[str, object] = {**_HELPERS, **source.constants}
        exec(compile(source.functions(body.true), "<selector>", "exec"), namespace)
    except (SyntaxError, RecursionError, MemoryError, VisitError):
        return None
    return namespace["_selects"], namespace["_selects_values"]  # type: ignore[return-value]


class Selector:
    """A compiled selector: ``selects(env)`` is True only for a message it selects.

    ``selects`` (and ``selects_values``) is one generated Python function (see
    _Source) when Python can compile it, else the closures' own answer; ``evaluate``
    is always the closures' (they are the specification the generated tests are
    checked against)."""

    __slots__ = ("text", "_expr", "names", "value_names", "selects", "selects_values")

    def __init__(self, text: str, expr: Expr, names: frozenset[str] = frozenset(), tests: tuple[Test, ValuesTest] | None = None):
        self.text = text
        self._expr = expr
        self.names = names  # the property and header names it reads
        self.value_names = tuple(sorted(names))  # the order selects_values takes their values in
        # Instance attributes, not methods: one call per message, no bound method made.
        # selects_values(values): selects' answer for the message whose value_names have
        # these values (a topic with this one selector reads them as a tuple, selection.py).
        if tests is None:
            self.selects: Test = lambda env: expr(env) is True
            self.selects_values: ValuesTest = lambda values: expr(dict(zip(self.value_names, values))) is True
        else:
            self.selects, self.selects_values = tests

    def evaluate(self, env: Env) -> bool | None:
        """The expression's three-valued truth for this message."""
        return truth(self._expr(env))

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


def compile_selector(text: str) -> Selector:
    """Parse and compile ``text``; SelectorError names what is wrong and where."""
    if not isinstance(text, str) or not text.strip():
        raise SelectorError("an empty selector")
    if len(text) > MAX_SELECTOR_LENGTH:
        raise SelectorError(f"a selector of {len(text)} characters (at most {MAX_SELECTOR_LENGTH})")
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as err:
        column = getattr(err, "column", None)
        token = getattr(err, "token", None)
        found = f"{str(token)!r}" if token is not None and str(token) else "the end"
        where = f" at column {column}" if isinstance(column, int) and column > 0 else ""
        raise SelectorError(
            f"selector syntax error{where}: unexpected {found}", column if isinstance(column, int) else None
        ) from None
    compiler = _Compile()
    try:
        expr = compiler.transform(tree)
    except VisitError as err:
        if isinstance(err.orig_exc, SelectorError):
            raise err.orig_exc from None
        raise
    return Selector(text, expr, frozenset(compiler.names), _generated_tests(tree))
