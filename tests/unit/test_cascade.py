"""The fast cascade check says exactly what the per-line regex says."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scout_slurm.evidence.cascade import CASCADE_PATTERNS, OWN_WATCHDOG, mentions_peer_failure

FRAGMENTS = (
    "Connection closed by peer",
    "connection RESET by peer",
    "Timed out waiting",
    "pair closure",
    "BROKEN PIPE",
    "remote process exited",
    "NCCL communicator was aborted",
    "nccl Error",
    "ProcessGroupNCCL",
    "ProcessGroupNCCL's watchdog: Timeout",
    "processgroupnccl abort",
    "DistBackendError",
    "connectFullMesh",
    "Socket Timeout",
    "recv operation",
    "send operation",
    "Application timeout caused",
    "watchdog caught collective operation timeout",
    "timeout",
    "abort",
    "NCCL",
    "Connection closed",
    "\n",
    " ",
    "K",
    "\u212a",
    "\u017f",
    "\u0130",
    "é",
    "RuntimeError: ",
    "Heartbeat monitor timed out! ",
    "(TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC)",
    "watchdog got stuck for 600 seconds",
    "stuck",
)


def per_line(lines):
    return any(CASCADE_PATTERNS.search(line) and not OWN_WATCHDOG.search(line) for line in lines)


line = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=8)), max_size=6).map("".join)


@settings(max_examples=400, deadline=None)
@given(st.lists(line, max_size=5))
def test_same_answer_as_the_regex_per_line(lines):
    assert mentions_peer_failure(lines) == per_line(lines)


def test_known_tails():
    gloo = [
        "Traceback (most recent call last):",
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
        "Connection closed by peer [10.12.3.17]:52431",
    ]
    assert mentions_peer_failure(gloo)
    assert (
        mentions_peer_failure(["[rank3]: ProcessGroupNCCL's watchdog got stuck", "then a Timeout"])
        is False
    )
    assert mentions_peer_failure(["ProcessGroupNCCL: Watchdog caught a Timeout"])
    assert not mentions_peer_failure(
        ["Fatal Python error: Segmentation fault", "ValueError: bad shape"]
    )
    assert not mentions_peer_failure([])
    # a line break between the two halves is no match, as per line
    assert not mentions_peer_failure(["Connection closed", "by peer"])


def test_the_last_line_shortcut_leaves_earlier_lines_and_other_text_to_the_full_check():
    assert mentions_peer_failure(["Broken pipe", "exiting"])  # only an earlier line says it
    assert mentions_peer_failure(["ok", "CONNECTION RESET BY PEER"])  # the last line, any case
    assert mentions_peer_failure(
        ["ok", "ProcessGroupNCCL timeout"]
    )  # the gapped pattern: full check
    assert mentions_peer_failure(
        ["é", "Connection closed by peer é"]
    )  # non-ASCII last line: the regex
    assert not mentions_peer_failure(["é", "closed by"])


def test_torchs_heartbeat_monitor_is_the_ranks_own_watchdog_not_a_peers_failure():
    """Its lines (as torch 2.x words them) name ProcessGroupNCCL and the heartbeat's TIMEOUT
    setting on one line: a hang of this rank's own NCCL calls, never a cascade; a peer's error
    beside it still is one."""
    own = [
        "[rank1]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 1] Heartbeat monitor timed out! Process "
        "will be terminated after dumping debug info. workMetaList_.size()=3",
        "[rank1]:[F ProcessGroupNCCL.cpp:1169] [PG 0 Rank 1] ProcessGroupNCCL's watchdog got stuck "
        "for 600 seconds without making progress in monitoring enqueued collectives. ... increase "
        "the timeout (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC) to a larger value",
    ]
    assert CASCADE_PATTERNS.search(own[1])  # what the bare pattern took it for
    assert not mentions_peer_failure(own)
    assert not mentions_peer_failure(own[::-1])
    assert mentions_peer_failure([*own, "RuntimeError: Connection reset by peer"])
