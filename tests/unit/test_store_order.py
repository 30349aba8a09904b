"""The listing's natural order: the fast path (one number between the same two texts) orders
exactly as the general key does, for every list, and list_records returns that order."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from scout_slurm.evidence.records import RankPlace
from scout_slurm.evidence.store import list_records, natural_key, sorted_natural, write_record
from tests.unit.test_verdict import place

_parts = st.sampled_from(["rank-", "exit-", "", "a", "rank", "-", ".json", "x1y", "ränk-"])
_digits = st.sampled_from(["0", "1", "2", "01", "001", "10", "9", "12345678901234567890", "١٢"])


@st.composite
def names(draw):
    shape = draw(st.sampled_from(["same", "mixed", "free"]))
    if shape == "free":
        return draw(st.lists(st.text(alphabet="ab-.0129²١", max_size=8), max_size=30))
    pre, suf = draw(_parts), draw(st.sampled_from([".json", "", ".json.tmp", "-x"]))
    out = []
    for _ in range(draw(st.integers(0, 30))):
        if shape == "mixed" and draw(st.booleans()):
            out.append(
                draw(_parts) + draw(_digits) + draw(_parts) + draw(st.sampled_from(["", "7"]))
            )
        else:
            out.append(pre + draw(_digits) + suf)
    return out


@settings(max_examples=400, deadline=None)
@given(names())
def test_fast_order_is_the_natural_order(listed):
    assert sorted_natural(listed) == sorted(listed, key=natural_key)


def test_equal_numbers_keep_the_listing_order_like_the_general_key():
    listed = ["rank-1.json", "rank-01.json", "rank-001.json", "rank-0.json"]
    assert (
        sorted_natural(listed)
        == sorted(listed, key=natural_key)
        == ["rank-0.json", "rank-1.json", "rank-01.json", "rank-001.json"]
    )


def test_a_name_with_a_superscript_digit_is_ordered_not_raised():
    listed = ["rank-1²3.json", "rank-2.json", "²"]
    assert (
        sorted_natural(listed)
        == sorted(listed, key=natural_key)
        == ["rank-1²3.json", "rank-2.json", "²"]
    )


def test_a_large_listing_in_rank_order():
    listed = [f"rank-{r}.json" for r in range(5000)]
    random.Random(7).shuffle(listed)
    assert sorted_natural(listed) == [f"rank-{r}.json" for r in range(5000)]


def test_list_records_returns_ranks_in_natural_order(tmp_path):
    for r in (10, 2, 1, 33, 0):
        write_record(tmp_path / f"rank-{r}.json", place(r, 40))
    (tmp_path / "rank-x.json").write_text(
        "{}"
    )  # matches the glob, is no record: one error, order kept
    records, errors = list_records(tmp_path, "rank-*.json", RankPlace)
    assert [p.rank for p in records] == [0, 1, 2, 10, 33]
    assert len(errors) == 1 and "rank-x.json" in errors[0]
