"""core/json_members.py and core/json_steps.py: an object that names a member twice is
read from its first member, as Triton's rapidjson finds a name (Triton 2.51 serves
`{"id": "a", "id": "b"}` as id "a"), at any depth, whether the document is parsed in
one call or in steps; a document that names nothing twice is orjson's value itself,
recognised without a second parse."""

from __future__ import annotations

import json
from unittest import mock

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from mini_triton.core import json_members, json_steps
from mini_triton.core.json_members import first_wins

STEPS = (32, 47, 101, 4096)  # json_steps cuts the documents at other places for each
# How first_wins may tell: short texts written again, every text walked first, and
# walks that give up early.
WAYS = ({"SHORT": json_members.SHORT}, {"SHORT": 0}, {"SHORT": 0, "WALK_BUDGET": 3})


def each_way():
    for way in WAYS:
        with mock.patch.multiple(json_members, **way):
            yield


def first_of_each_name(pairs):
    members = {}
    for name, value in pairs:
        members.setdefault(name, value)
    return members


def triton_reads(text: bytes):
    """The reference: Python's reader keeping the first member of a name."""
    return json.loads(text, object_pairs_hook=first_of_each_name)


# JSON texts written member by member, so that an object may name a member twice;
# names and strings with colons and escapes among them (an ASCII-only text writes a colon
# in a string as \u003a, which the colons of the text do not show).
names = st.sampled_from(["a", "b", "id", "x:y", "é", ":", ""])
strings = st.text(alphabet="ab:\"\\é\n", max_size=6)
scalars = st.none() | st.booleans() | st.integers(-10**6, 10**6) | strings


def written(ascii_only: bool):
    def text_of(string: str) -> str:  # ASCII-only texts escape colons too: \u003a
        text = json.dumps(string, ensure_ascii=ascii_only)
        return text.replace(":", "\\u003a") if ascii_only else text

    leaves = scalars.map(lambda v: text_of(v) if isinstance(v, str) else json.dumps(v))
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=5).map(lambda items: "[" + ",".join(items) + "]")
        | st.lists(st.tuples(names, inner), max_size=5).map(
            lambda members: "{" + ",".join(f"{text_of(n)}:{v}" for n, v in members) + "}"),
        max_leaves=40)


@settings(max_examples=300, deadline=None)
@given(text=st.booleans().flatmap(written))
def test_a_name_named_twice_is_read_from_its_first_member(text):
    document = text.encode()
    expected = triton_reads(document)
    for _ in each_way():
        assert first_wins(document, orjson.loads(document)) == expected
    for step in STEPS:
        assert json_steps.loads(document, step=step) == expected


@settings(max_examples=150, deadline=None)
@given(value=st.recursive(scalars, lambda inner: st.lists(inner, max_size=5)
                          | st.dictionaries(names, inner, max_size=5), max_leaves=40),
       ascii_only=st.booleans())
def test_a_document_that_names_nothing_twice_is_not_parsed_again(value, ascii_only):
    document = json.dumps(value, ensure_ascii=ascii_only).encode()
    parsed = orjson.loads(document)
    for _ in each_way():
        assert first_wins(document, parsed) is parsed


def test_the_first_member_keeps_its_place():
    document = b'{"b": 1, "a": {"k": [1], "k": 2}, "b": 3, "c": 4}'
    value = first_wins(document, orjson.loads(document))
    assert list(value.items()) == [("b", 1), ("a", {"k": [1]}), ("c", 4)]


def test_an_escaped_colon_does_not_hide_a_repeated_name():
    """`{"a": 1, "a": "\\u003a"}` has two colons, as orjson's writing of its last-wins
    value `{"a":":"}` has: where there are \\u escapes, colons are counted outside
    strings."""
    document = b'{"a": 1, "a": "\\u003a"}'
    assert first_wins(document, orjson.loads(document)) == {"a": 1}


def test_a_name_repeated_after_a_long_list_is_found():
    """The count of keys passes over long data lists: a name repeated after one is found
    by counting what orjson writes."""
    data = list(range(json_members.WALK_BUDGET * 4))
    document = orjson.dumps({"inputs": [{"name": "I", "data": data}]})[:-1] + \
        b',"inputs":[]}'
    assert first_wins(document, orjson.loads(document)) == {
        "inputs": [{"name": "I", "data": data}]}
    colons = b'{"data": ["a:b", "c:d"], "id": "x", "id": "y"}'  # colons in strings
    assert first_wins(colons, orjson.loads(colons))["id"] == "x"


def test_colons_in_the_strings_of_a_long_document_are_told_from_members():
    """A long text of numbers whose id has a colon: counted against its members outside
    strings, it is orjson's value itself; with a name repeated, the first member's."""
    head = b'{"id": "req:1", "inputs": [{"name": "I", "data": '
    document = head + orjson.dumps([0.25] * 5000) + b"}]}"
    parsed = orjson.loads(document)
    assert first_wins(document, parsed) is parsed
    repeated = document[:-1] + b', "id": "req:2"}'
    assert first_wins(repeated, orjson.loads(repeated))["id"] == "req:1"


def test_numbers_read_apart_land_where_they_were():
    """A document that repeats a name and is mostly numbers is read again with its
    arrays of numbers cut out (orjson reads them): each comes back in its place, and a
    string that looks like one stays a string."""
    row = list(range(40))
    document = orjson.dumps({"a": 0, "flat": [0.5] * 300, "rows": [row] * 20,
                             "cube": [[row, row]] * 5, "short": [1, 2],
                             "text": "[" + "1, " * 300 + "1]", "mixed": [[1.5] * 30, "x"],
                             "objects": [{"k": [2] * 100}] * 3})
    document = document[:-1] + b',"a":1,"objects":[]}'
    assert document.count(b'"') * 8 < len(document)  # mostly numbers: the arrays are cut
    value = first_wins(document, orjson.loads(document))
    assert value == triton_reads(document)
    assert value["a"] == 0 and value["objects"] == [{"k": [2] * 100}] * 3


def test_a_large_document_parsed_in_steps_keeps_the_first_member():
    """A body past one step (decoded off the loop, in steps): names repeated inside a run
    of members, across runs, and after a value longer than a step."""
    data = [0.5] * 100_000
    document = (b'{"id": "first", "parameters": {"p": 1, "p": 2}, "inputs": '
                + orjson.dumps([{"name": "I", "data": data}])
                + b', "id": "second", "parameters": {"q": 3}, "text": "'
                + b"x" * 300_000 + b'", "text": "short"}')
    assert len(document) > json_steps.STEP
    value = json_steps.loads(document)
    assert value["id"] == "first" and value["parameters"] == {"p": 1}
    assert value["text"] == "x" * 300_000 and value["inputs"][0]["data"] == data
