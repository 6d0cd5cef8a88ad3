"""router.core.selector: the JMS selector grammar and its three-valued logic, against
a reference evaluator written independently (truth tables as 'T'/'F'/'U', LIKE by
recursion, Java's integer division by fractions), over hypothesis-made expressions
and messages; and router.core.msgfields: what a selector sees of a real message."""

from __future__ import annotations

import math
import uuid
from fractions import Fraction

import proton
import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.core.msgfields import selector_env
from router.core.selector import SelectorError, compile_selector

NAMES = ("a", "b", "c", "d")
values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-1000, 1000),
    st.integers(-100000, 100000).map(lambda x: x / 100),
    st.text(alphabet="ab%_x", max_size=4),
)
envs = st.fixed_dictionaries({n: values for n in NAMES})

# ---------------------------------------------------------------- expressions as trees

leaves = st.one_of(
    st.sampled_from(NAMES).map(lambda n: ("ident", n)),
    st.integers(0, 1000).map(lambda v: ("int", v)),
    st.integers(0, 100000).map(lambda v: ("float", v / 100)),
    st.booleans().map(lambda v: ("boollit", v)),
    st.text(alphabet="ab%_x'", max_size=4).map(lambda v: ("str", v)),
)
sums = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.tuples(st.just("neg"), inner),
        st.tuples(st.just("arith"), st.sampled_from("+-*/"), inner, inner),
    ),
    max_leaves=4,
)
patterns = st.text(alphabet="ab%_x!", max_size=5)
conditions = st.recursive(
    st.one_of(
        st.tuples(st.just("cmp"), st.sampled_from(["=", "<>", "<", ">", "<=", ">="]), sums, sums),
        st.tuples(st.just("between"), st.booleans(), sums, sums, sums),
        st.tuples(st.just("like"), st.booleans(), st.sampled_from(NAMES), patterns, st.sampled_from([None, "!"])),
        st.tuples(
            st.just("in"),
            st.booleans(),
            st.sampled_from(NAMES),
            st.lists(st.text(alphabet="abx", max_size=2), min_size=1, max_size=3),
        ),
        st.tuples(st.just("null"), st.booleans(), sums),
        st.sampled_from(NAMES).map(lambda n: ("bool", n)),
        st.booleans().map(lambda v: ("lit", v)),
    ),
    lambda inner: st.one_of(
        st.tuples(st.just("not"), inner),
        st.tuples(st.sampled_from(["and", "or"]), inner, inner),
    ),
    max_leaves=6,
)


def q(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def render(t) -> str:
    kind = t[0]
    if kind == "ident":
        return t[1]
    if kind == "int":
        return str(t[1])
    if kind == "float":
        return f"{t[1]:.2f}"
    if kind == "str":
        return q(t[1])
    if kind == "boollit":
        return "TRUE" if t[1] else "FALSE"
    if kind == "neg":
        return f"-({render(t[1])})"
    if kind == "arith":
        return f"({render(t[2])} {t[1]} {render(t[3])})"
    if kind == "cmp":
        return f"({render(t[2])} {t[1]} {render(t[3])})"
    if kind == "between":
        return f"({render(t[2])} {'NOT ' if t[1] else ''}BETWEEN {render(t[3])} AND {render(t[4])})"
    if kind == "like":
        esc = f" ESCAPE {q(t[4])}" if t[4] else ""
        return f"({t[2]} {'not ' if t[1] else ''}LIKE {q(t[3])}{esc})"
    if kind == "in":
        return f"({t[2]} {'NOT ' if t[1] else ''}In ({', '.join(q(x) for x in t[3])}))"
    if kind == "null":
        return f"({render(t[2])} IS {'NOT ' if t[1] else ''}NULL)"
    if kind == "bool":
        return t[1]
    if kind == "lit":
        return "TRUE" if t[1] else "false"
    if kind == "not":
        return f"(NOT {render(t[1])})"
    return f"({render(t[1])} {kind.upper()} {render(t[2])})"


# ---------------------------------------------------------------- the reference


def num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def ref_value(t, env):
    kind = t[0]
    if kind == "ident":
        return env.get(t[1])
    if kind in ("int", "float", "str", "boollit"):
        return t[1]
    if kind == "neg":
        v = ref_value(t[1], env)
        return -v if num(v) else None
    a, b = ref_value(t[2], env), ref_value(t[3], env)
    if not (num(a) and num(b)):
        return None
    op = t[1]
    if op == "/":
        if b == 0:
            return None
        if isinstance(a, int) and isinstance(b, int):
            return math.trunc(Fraction(a, b))
        r = a / b
        return r if math.isfinite(r) else None
    return {"+": a + b, "-": a - b, "*": a * b}[op]


def ref_cmp(op, a, b) -> str:
    if a is None or b is None:
        return "U"
    if num(a) and num(b):
        result = {"=": a == b, "<>": a != b, "<": a < b, ">": a > b, "<=": a <= b, ">=": a >= b}[op]
    elif type(a) is type(b) and type(a) in (str, bool) and op in ("=", "<>"):
        result = (a == b) if op == "=" else (a != b)
    else:
        result = False
    return "T" if result else "F"


AND = {("T", "T"): "T", ("T", "F"): "F", ("T", "U"): "U", ("F", "T"): "F", ("F", "F"): "F", ("F", "U"): "F"}
AND.update({("U", "T"): "U", ("U", "F"): "F", ("U", "U"): "U"})
OR = {("T", "T"): "T", ("T", "F"): "T", ("T", "U"): "T", ("F", "T"): "T", ("F", "F"): "F", ("F", "U"): "U"}
OR.update({("U", "T"): "T", ("U", "F"): "U", ("U", "U"): "U"})
NOT = {"T": "F", "F": "T", "U": "U"}


def like_match(s: str, p: str, esc) -> bool:
    if not p:
        return not s
    if esc and p[0] == esc and len(p) > 1:
        return bool(s) and s[0] == p[1] and like_match(s[1:], p[2:], esc)
    if p[0] == "%":
        return any(like_match(s[i:], p[1:], esc) for i in range(len(s) + 1))
    if p[0] == "_":
        return bool(s) and like_match(s[1:], p[1:], esc)
    return bool(s) and s[0] == p[0] and like_match(s[1:], p[1:], esc)


def ref(t, env) -> str:
    kind = t[0]
    if kind == "cmp":
        return ref_cmp(t[1], ref_value(t[2], env), ref_value(t[3], env))
    if kind == "between":
        v = ref_value(t[2], env)
        r = AND[(ref_cmp(">=", v, ref_value(t[3], env)), ref_cmp("<=", v, ref_value(t[4], env)))]
        return NOT[r] if t[1] else r
    if kind == "like":
        v = env.get(t[2])
        r = "U" if v is None else ("T" if isinstance(v, str) and like_match(v, t[3], t[4]) else "F")
        return NOT[r] if t[1] else r
    if kind == "in":
        v = env.get(t[2])
        r = "U" if v is None else ("T" if isinstance(v, str) and v in t[3] else "F")
        return NOT[r] if t[1] else r
    if kind == "null":
        is_null = ref_value(t[2], env) is None
        return "T" if is_null != t[1] else "F"
    if kind == "bool":
        v = env.get(t[1])
        return "U" if not isinstance(v, bool) else ("T" if v else "F")
    if kind == "lit":
        return "T" if t[1] else "F"
    if kind == "not":
        return NOT[ref(t[1], env)]
    table = AND if kind == "and" else OR
    return table[(ref(t[1], env), ref(t[2], env))]


@given(conditions, envs)
def test_selectors_agree_with_the_reference(tree, env):
    text = render(tree)
    expected = ref(tree, env)
    selector = compile_selector(text)
    got = selector.evaluate(env)
    assert {True: "T", False: "F", None: "U"}[got] == expected, text
    assert selector.selects(env) is (expected == "T"), text  # the generated test, against the same reference
    values = tuple(env.get(name) for name in selector.value_names)
    assert selector.selects_values(values) is (expected == "T"), text


def test_a_selector_too_deep_for_pythons_compiler_is_answered_by_its_closures():
    text = " OR ".join(f"a={i}" for i in range(400))  # 400 levels: past the 200 Python's parser takes
    selector = compile_selector(text)
    assert selector.selects.__name__ != "_selects"  # not the generated function
    assert selector.selects({"a": 399}) is True and selector.selects({"a": 400}) is False
    assert selector.selects({}) is False and selector.evaluate({}) is None
    assert selector.selects_values((399,)) is True and selector.selects_values((None,)) is False


@pytest.mark.parametrize(
    "text, env, expected",
    [
        ("a = 1 OR b = 1 AND c = 1", {"a": 1, "b": 0, "c": 0}, True),  # AND binds tighter than OR
        ("NOT a = 1 AND b = 1", {"a": 2, "b": 1}, True),  # NOT tighter than AND
        ("a + 2 * 3 = 7", {"a": 1}, True),  # * before +
        ("a - 2 - 3 = 0", {"a": 5}, True),  # left to right
        ("-7 / 2 = -3", {}, True),  # Java's integer division truncates towards zero
        ("7 / 2.0 = 3.5", {}, True),
        ("a / 0 IS NULL", {"a": 1}, True),
        ("x = 'it''s'", {"x": "it's"}, True),
        ("x LIKE '10!%' ESCAPE '!'", {"x": "10%"}, True),
        ("x LIKE '10!%' ESCAPE '!'", {"x": "100"}, False),
        ("nothing <> 1", {}, None),
        ("nothing IS NULL AND 1 = 1", {}, True),
        ("NOT (nothing = 1)", {}, None),
        ("flag", {"flag": True}, True),
        ("flag", {"flag": "yes"}, None),
        ("s > 'a'", {"s": "b"}, False),  # strings order with = and <> only
        ("t = TRUE", {"t": True}, True),
        ("1.5e1 = 15", {}, True),
        (".5 = 0.5", {}, True),
        ("JMSPriority > 4 and color in ('red', 'blue')", {"JMSPriority": 9, "color": "blue"}, True),
        ("t = TRUE", {"t": 1}, False),  # unlike types (though 1 == True in Python)
        ("FALSE <> t", {"t": 0}, False),
        ("t = 1", {"t": True}, False),
        ("s = 'red'", {"s": 5}, False),
        ("s <> 'red'", {"s": 5}, False),
        ("'red' = s", {"s": "red"}, True),
        ("n > -3", {"n": -2}, True),
        ("n >= 2.5 AND n <= 3", {"n": 3}, True),
        ("n BETWEEN 1 AND 3", {"n": True}, False),
        # an integer too large for a float meeting a float: no value, never an error (a
        # subscriber's literal; an error would stop the message for every subscriber)
        ("1" + "0" * 400 + " * f > 0", {"f": 1.5}, None),
        ("f - 1" + "0" * 400 + " IS NULL", {"f": 1.5}, True),
        ("1" + "0" * 400 + " / f > 0", {"f": 2.5}, None),
    ],
)
def test_precedence_literals_and_unknowns(text, env, expected):
    selector = compile_selector(text)
    assert selector.evaluate(env) is expected
    assert selector.selects(env) is (expected is True)  # the generated tests
    assert selector.selects_values(tuple(env.get(name) for name in selector.value_names)) is (expected is True)


@pytest.mark.parametrize(
    "text, fragment, column",
    [
        ("color = ", "unexpected the end", 7),
        ("a >> 1", "unexpected '>'", 4),
        ("a LIKE 'x' ESCAPE 'ab'", "ESCAPE takes one character", 19),
        ("a IN ()", "unexpected ')'", 7),
        ("and = 1", "is a keyword", 1),
        ("a = 'unterminated", "syntax error", None),
        ("   ", "an empty selector", None),
        ("x" * 5000 + " = 1", "at most 4096", None),
    ],
)
def test_bad_selectors_say_what_and_where(text, fragment, column):
    with pytest.raises(SelectorError) as err:
        compile_selector(text)
    assert fragment in str(err.value), str(err.value)
    if column is not None:
        assert err.value.position == column


def test_what_a_selector_sees_of_a_message():
    message = proton.Message(
        body="payload",
        properties={"color": "red", "n": 7, "w": 2.5, "ok": True, "raw": b"\x00", "many": [1, 2]},
        id=uuid.UUID(int=5),
        correlation_id="corr-1",
        subject="order",
        durable=True,
        priority=9,
        creation_time=1234.5,
        user_id=b"alice",
        group_id="g",
        group_sequence=3,
    )
    env = selector_env(message.encode())
    assert {k: env[k] for k in ("color", "n", "w", "ok", "raw", "many")} == {
        "color": "red",
        "n": 7,
        "w": 2.5,
        "ok": True,
        "raw": None,
        "many": None,
    }
    assert env["JMSDeliveryMode"] == "PERSISTENT" and env["JMSPriority"] == 9
    assert env["JMSMessageID"] == str(uuid.UUID(int=5)) and env["JMSCorrelationID"] == "corr-1"
    assert env["JMSType"] == "order" and env["JMSTimestamp"] == 1234500 and env["JMSXUserID"] == "alice"
    assert env["JMSXGroupID"] == "g" and env["JMSXGroupSeq"] == 3 and env["JMSExpiration"] == 0
    bare = selector_env(proton.Message(body="x").encode())
    assert bare["JMSPriority"] == 4 and bare["JMSDeliveryMode"] == "NON_PERSISTENT" and "color" not in bare
    assert compile_selector("color = 'red' AND JMSPriority > 4").selects(env)
    assert not compile_selector("color = 'red'").selects(bare)


@given(st.binary(max_size=64))
def test_any_bytes_decode_to_an_environment_never_an_error(payload):
    env = selector_env(b"\x00\x53\x74" + payload)
    assert env["JMSPriority"] == 4 or isinstance(env["JMSPriority"], int)
