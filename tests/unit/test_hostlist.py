"""Slurm hostlist expressions both ways: fixed cases, malformed input, and round trips."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scout_slurm.errors import SlurmError
from scout_slurm.slurm.hostlist import compress_hostlist, expand_hostlist


@pytest.mark.parametrize(
    "expr, hosts",
    [
        ("n1", ["n1"]),
        ("n[1-4]", ["n1", "n2", "n3", "n4"]),
        ("n[1-3,7]", ["n1", "n2", "n3", "n7"]),
        ("n[1,4]", ["n1", "n4"]),
        ("n4,n1", ["n4", "n1"]),  # Slurm's ExcNodeList keeps the given order
        ("gpu[01-03]", ["gpu01", "gpu02", "gpu03"]),  # zero padding kept
        ("gpu[08-11]", ["gpu08", "gpu09", "gpu10", "gpu11"]),  # padding width from the low end
        ("gpu[001-002]-ib", ["gpu001-ib", "gpu002-ib"]),  # suffix after the bracket
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        (
            "r[1-2]x[3,5]y[0-1]",
            ["r1x3y0", "r1x3y1", "r1x5y0", "r1x5y1", "r2x3y0", "r2x3y1", "r2x5y0", "r2x5y1"],
        ),
        ("n[1-2],login1,gpu[01-02]", ["n1", "n2", "login1", "gpu01", "gpu02"]),
        ("n[1-3],n2,n[2-4]", ["n1", "n2", "n3", "n4"]),  # duplicates dropped, first place kept
        ("n[1-2] , n5", ["n1", "n2", "n5"]),  # spaces around a comma are not part of a name
        ("[1-3]", ["1", "2", "3"]),
        ("n[ 1-2 ]", ["n1", "n2"]),
        ("node.a_b-1", ["node.a_b-1"]),
        ("n[7]", ["n7"]),
        ("n[5-5]", ["n5"]),
        ("n1,", ["n1"]),
        ("", []),
        ("   ", []),
        ("(null)", []),
    ],
)
def test_expand(expr, hosts):
    assert expand_hostlist(expr) == hosts


def test_expand_none_is_empty():
    assert expand_hostlist(None) == []  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "hosts, expr",
    [
        (["n1", "n2", "n3", "n7"], "n[1-3,7]"),
        (["n1"], "n1"),
        (["n4", "n1"], "n[1,4]"),
        (["gpu01", "gpu02", "gpu03"], "gpu[01-03]"),
        (["gpu09", "gpu10"], "gpu09,gpu10"),  # different widths are different groups
        (["n9", "n10", "n11"], "n[9-11]"),
        (["login", "n1", "n2"], "login,n[1-2]"),
        (["n2", "n1", "n2"], "n[1-2]"),
        (["n1", "n01"], "n1,n01"),
        (["rack1-n1", "rack1-n2"], "rack1-n[1-2]"),
        ([], ""),
    ],
)
def test_compress(hosts, expr):
    assert compress_hostlist(hosts) == expr


@pytest.mark.parametrize(
    "expr, words",
    [
        ("n[1-2", "unbalanced '['"),
        ("n1-2]", "unbalanced ']'"),
        ("n]1[", "unbalanced ']'"),
        ("n[[1-2]]", "nested"),
        ("n[3-1]", "backwards"),
        ("n[a-b]", "not numeric"),
        ("n[1-]", "not numeric"),
        ("n[-1]", "not numeric"),
        ("n[1-2-3]", "not numeric"),
        ("n[x]", "not a number"),
        ("n[]", "not a valid host name"),
        ("n[²-3]", "not numeric"),  # str.isdigit says yes to '²'; int() does not
        ("n[²]", "not a number"),
        ("n1;rm", "not a valid host name"),
        ("n$(x)", "not a valid host name"),
        ("n`x`", "not a valid host name"),
        ("n 1", "not a valid host name"),
        ("n1\nn2", "not a valid host name"),
        ("n1/../x", "not a valid host name"),
        ("n[1-2];x", "not a valid host name"),
        ("n[1-2]$", "not a valid host name"),
        ("n[0-2000000]", "too large"),
    ],
)
def test_expand_rejects_malformed(expr, words):
    with pytest.raises(SlurmError, match=re.escape(words)):
        expand_hostlist(expr)


@pytest.mark.parametrize(
    "hosts", [["n1;rm"], ["n 1"], [""], ["n1\n"], ["$(x)"], ["a,b"], ["n[1-2]"]]
)
def test_compress_rejects_bad_names(hosts):
    with pytest.raises(SlurmError, match="not a valid host name"):
        compress_hostlist(hosts)


# -- properties ---------------------------------------------------------------------------------

# Host names scout may meet: Slurm's characters, often ending in a (maybe zero-padded) number.
# "None" and "(null)" are left out: expand_hostlist reads those as "no nodes" on purpose.
_stem = st.text(alphabet="abcnrgpu-._", min_size=1, max_size=4)
_numbered = st.builds(
    lambda stem, n, pad: stem + str(n).zfill(pad), _stem, st.integers(0, 300), st.integers(0, 4)
)
_plain = st.text(alphabet="abcnxyz-._", min_size=1, max_size=6)
_name = st.one_of(_numbered, _numbered, _plain, st.from_regex(r"\A[A-Za-z0-9._-]{1,8}\Z")).filter(
    lambda s: s != "None"
)
_names = st.lists(_name, max_size=40)


def _natural(name: str) -> tuple:
    """The order compress_hostlist writes names in: per (prefix, padding width), by number."""
    m = re.fullmatch(r"(.*?)(\d+)", name)
    if not m:
        return (name, -1, -1)
    prefix, num = m.groups()
    return (prefix, len(num) if num.startswith("0") and len(num) > 1 else 0, int(num))


@settings(max_examples=300, deadline=None)
@given(_names)
def test_expand_of_compress_is_the_same_set(names):
    out = expand_hostlist(compress_hostlist(names))
    assert set(out) == set(names)
    assert len(out) == len(set(names))


@settings(max_examples=300, deadline=None)
@given(_names)
def test_expand_of_compress_keeps_sorted_order(names):
    ordered = sorted(set(names), key=_natural)
    assert expand_hostlist(compress_hostlist(ordered)) == ordered


@settings(max_examples=300, deadline=None)
@given(_names)
def test_compress_of_expand_expands_to_the_same_list(names):
    expr = compress_hostlist(names)
    hosts = expand_hostlist(expr)
    assert expand_hostlist(compress_hostlist(hosts)) == hosts
    assert compress_hostlist(hosts) == expr  # the compressed form is canonical


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="n01289[]-,;$ `\n()x", max_size=20))
def test_expand_raises_only_slurm_error(expr):
    try:
        hosts = expand_hostlist(expr)
    except SlurmError:
        return
    for h in hosts:
        assert re.fullmatch(r"[A-Za-z0-9._-]+", h)
