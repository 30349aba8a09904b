"""The HTML incident and acceptance pages on synthetic bundles: one timeline row per drawn rank,
the suspect highlighted, the moments in order, the hardware table with drained nodes, and every
hostile string from the evidence escaped (no tag, no script, no attribute breaks out)."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from scout_slurm.evidence.history import (
    HistoryWriter,
    ProgressSample,
    decode_history,
    encode_header,
    slot_offset,
)
from scout_slurm.evidence.records import (
    ChildState,
    ExitRecord,
    Finding,
    FindingKind,
    ProgressSnapshot,
    RankPlace,
    StallDecision,
    Suspect,
    Verdict,
    VerdictKind,
)
from scout_slurm.localise.verdict import JobEvidence
from scout_slurm.remediation.records import (
    ActionKind,
    ActionResult,
    ActionsRecord,
    Drain,
    PlannedAction,
    PlanStatus,
    Requeue,
    ResumeFrom,
    ResumeInstruction,
)
from scout_slurm.report.bundle import (
    IncidentBundle,
    incident_moments,
    last_advance,
)
from scout_slurm.report.html import (
    AcceptanceCheck,
    AcceptanceReport,
    LatencyCase,
    render_acceptance_html,
    render_incident_html,
)
from scout_slurm.report.map_table import RankMapRow
from scout_slurm.report.svg import MAX_ROWS, esc, pick_rows, segments

T0 = 1_700_000_000.0
EVIL = '<script>alert("x")</script><img src=x onerror=alert(1)>"\'&\x00\x1b[31m'


def node(rank: int) -> str:
    return f"n{rank // 2 + 1}"


def samples(
    rank: int, *, stop_at: float, end: float, state_after=ChildState.RUNNING
) -> tuple[ProgressSample, ...]:
    out, t, seq, done = [], T0 - 3, 0, 0
    while t <= end:
        seq += 1
        if T0 < t < stop_at:  # before T0: imports and rendezvous, no progress yet
            done += 4
        state = state_after if t >= stop_at else ChildState.RUNNING
        out.append(
            ProgressSample(
                seq=seq,
                at=t,
                opt_steps=done // 4,
                coll_completed=done,
                coll_entered=done + (1 if t >= stop_at and rank != 1 else 0),
                state=state,
                in_collective=t >= stop_at and rank != 1,
            )
        )
        t += 0.5
    return tuple(out)


def snap(
    rank: int, steps: int, *, node_name: str | None = None, state=ChildState.RUNNING
) -> ProgressSnapshot:
    return ProgressSnapshot(
        rank=rank,
        node=node_name or node(rank),
        pid=10 + rank,
        published_at=T0 + 12,
        child_state=state,
        coll_entered=steps * 4 + (rank != 1),
        coll_completed=steps * 4,
        in_collective=rank != 1,
        current_op="all_reduce" if rank != 1 else "none",
        opt_steps=steps,
        pg_seq=steps * 4,
        idle_s=6.0,
        step_time_s=0.1,
    )


def place(rank: int, world: int, node_name: str | None = None) -> RankPlace:
    return RankPlace(
        job_id=77,
        restart=0,
        rank=rank,
        local_rank=rank % 2,
        world_size=world,
        node=node_name or node(rank),
        hostname=f"host-{node(rank)}",
        task_pid=1,
        child_pid=2,
        gpu_uuids=(f"GPU-{rank:04d}",),
        cuda_visible_devices="0",
        nic="eth0",
        master_addr="10.0.0.1",
        master_port=29500,
        started_at=T0 - 5,
    )


def hang_bundle(world: int = 4, *, evil: bool = False, with_history: bool = True) -> IncidentBundle:
    suspect = 1
    nodes = {r: (EVIL if evil and r == suspect else node(r)) for r in range(world)}
    history = {
        r: samples(r, stop_at=T0 + 5 + (0 if r == suspect else 0.3), end=T0 + 12)
        for r in range(world)
    }
    decision = StallDecision(
        decided_by=0,
        at=T0 + 11,
        culprits=(suspect,),
        kind=FindingKind.HANG,
        reasoning=(f"rank {suspect} is behind" + (EVIL if evil else ""),),
    )
    findings = (
        Finding(
            rank=suspect,
            node=nodes[suspect],
            kind=FindingKind.INFO,
            at=T0 + 5.1,
            summary="fault injected: sleep",
        ),
        Finding(
            rank=suspect,
            node=nodes[suspect],
            kind=FindingKind.STALL_SUSPECT,
            at=T0 + 10,
            summary="no progress" + (EVIL if evil else ""),
        ),
    )
    exits = {
        r: ExitRecord(
            rank=r,
            node=nodes[r],
            pid=10 + r,
            exit_code=86 if r == suspect else 87,
            signal=0,
            core_dumped=False,
            at=T0 + 11.5,
            killed_by_scout=True,
            last_progress=snap(r, 12),
            stderr_tail=((EVIL,) if evil else ("bye",)),
        )
        for r in range(world)
    }
    ev = JobEvidence(
        job_id=77,
        restart=0,
        world_size=world,
        places={r: place(r, world, nodes[r]) for r in range(world)},
        exits=exits,
        snapshots={r: snap(r, 12, node_name=nodes[r]) for r in range(world)},
        findings=findings,
        decision=decision,
    )
    verdict = Verdict(
        job_id=77,
        restart=0,
        kind=VerdictKind.HANG,
        suspects=(
            Suspect(
                suspect,
                nodes[suspect],
                VerdictKind.HANG,
                0.9,
                ("rank 1 stopped first" + (EVIL if evil else ""),),
            ),
        ),
        confidence=0.9,
        reasoning=("rank(s) 1 stopped making progress first", EVIL if evil else "ok"),
        first_failure_at=T0 + 11,
        first_suspect_step=13,
        world_size=world,
        created_at=T0 + 12,
    )
    drain_target = nodes[suspect]
    actions = ActionsRecord(
        job_id=77,
        restart=0,
        verdict_kind=VerdictKind.HANG,
        status=PlanStatus.APPLIED,
        actions=(
            PlannedAction.of(Drain(drain_target, "scout: hang rank 1")),
            PlannedAction.of(Requeue(77)),
            PlannedAction.of(ResumeFrom("/ck/step-10.pt", 10, 13, "")),
        ),
        held_back=(EVIL,) if evil else (),
        results=(
            ActionResult(ActionKind.DRAIN, drain_target, True, "drained", 1, T0 + 12.5),
            ActionResult(ActionKind.REQUEUE, "77", True, "requeued", 1, T0 + 13.0),
        ),
        created_at=T0 + 12,
        updated_at=T0 + 13,
    )
    hw = tuple(
        RankMapRow(
            rank=r,
            local_rank=r % 2,
            node=nodes[r],
            hostname=f"host-{r}",
            gpu_uuids=(EVIL if evil else f"GPU-{r:04d}",),
            gpu_serials=("S1",),
            nic="eth0",
        )
        for r in range(world)
    )
    resume = ResumeInstruction(
        job_id=77,
        restart=1,
        checkpoint="/ck/step-10.pt",
        step=10,
        reason="step 10, before first suspect step 13" + (EVIL if evil else ""),
    )
    return IncidentBundle(
        cluster="lab",
        verdict=verdict,
        evidence=ev,
        actions=actions,
        history=history if with_history else {},
        hardware=hw,
        resume=resume,
        problems=(EVIL,) if evil else (),
    )


class Tree(HTMLParser):
    """The tags and attributes a browser would build (the stdlib parser follows HTML5
    tokenising).
    """

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def parse(page: str) -> Tree:
    t = Tree()
    t.feed(page)
    t.close()
    return t


def test_timeline_has_one_row_per_rank_and_marks_the_suspect():
    page = render_incident_html(hang_bundle())
    tree = parse(page)
    rows = [a for tag, a in tree.tags if tag == "g" and "rank-row" in a.get("class", "")]
    assert [int(a["data-rank"]) for a in rows] == [0, 1, 2, 3]
    assert [a["data-rank"] for a in rows if "suspect" in a["class"]] == ["1"]
    bars = [a for tag, a in tree.tags if tag == "rect" and "bar" in a.get("class", "")]
    assert any("advancing" in a["class"] for a in bars) and any("idle" in a["class"] for a in bars)
    moments = [
        a["data-moment"] for tag, a in tree.tags if tag == "g" and a.get("class") == "moment"
    ]
    assert moments == ["fault", "detection", "verdict", "actions done"]
    # self-contained: nothing fetched, nothing run
    assert not [t for t, a in tree.tags if t in ("script", "link", "iframe", "img", "object")]
    assert "Content-Security-Policy" in page and "http://" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', ""
    )
    assert 'class="badge drained"' in page and "/ck/step-10.pt" in page
    # the verdict says what was checked (this bundle's run has no coverage record)
    assert (
        "Checks that ran: no record of scout&#x27;s checks in this run" in page
        or "Checks that ran: no record of scout's checks in this run" in page
    )


def test_the_page_lists_the_checks_that_ran():
    import dataclasses

    from scout_slurm.evidence.records import VoteCoverage

    b = hang_bundle()
    cov = VoteCoverage(
        restart=0,
        votes=2,
        last_clean_step=20,
        last_vote_step=20,
        replay_rounds=4,
        timing_rounds=1,
        votes_every=10,
        replay_every=5,
        timing_every=25,
        steps=23,
    )
    page = render_incident_html(
        dataclasses.replace(b, verdict=dataclasses.replace(b.verdict, coverage=cov))
    )
    assert (
        "Checks that ran: state votes (every 10 steps): 2, the last at step 20, every replica "
        "agreed up to "
        "step 20; in-situ replay (every 5 steps): 4 rounds; timing votes (every 25 steps): 1 rounds"
    ) in page


def test_moments_and_phases_of_a_hang():
    b = hang_bundle()
    m = incident_moments(b)
    assert m.fault_at == T0 + 5.1
    assert m.detected_at == T0 + 11 and m.verdict_at == T0 + 12 and m.actions_done_at == T0 + 13
    # rank 1's last advance is the first sample at its final position
    assert m.last_advance_at == last_advance(b.history[1]) == T0 + 4.5
    labels = [p[0] for p in m.phases()]
    assert labels == ["fault -> detection", "detection -> verdict", "verdict -> actions done"]
    assert [round(p[2] - p[1], 3) for p in m.phases()] == [5.9, 1.0, 1.0]


def test_without_history_the_snapshot_still_draws_each_rank():
    page = render_incident_html(hang_bundle(with_history=False))
    tree = parse(page)
    rows = [a for tag, a in tree.tags if tag == "g" and "rank-row" in a.get("class", "")]
    assert len(rows) == 4
    assert (
        sum(1 for tag, a in tree.tags if tag == "rect" and "bar advancing" in a.get("class", ""))
        == 4
    )


def test_hostile_strings_are_escaped_everywhere():
    page = render_incident_html(hang_bundle(evil=True))
    tree = parse(page)
    assert not [t for t, a in tree.tags if t in ("script", "img")]
    assert not [a for t, a in tree.tags if any(k.startswith("on") for k in a)]
    assert "<script" not in page and "<img" not in page
    assert "&lt;script&gt;" in page
    assert "\x00" not in page and "\x1b" not in page
    # the text is still there for a person to read
    assert any("alert(" in t for t in tree.text)


def test_escape_bounds_and_replaces_control_characters():
    assert esc("a" * 1000, 10) == "a" * 10 + "\u2026"
    assert esc("<b>\x07") == "&lt;b&gt;\ufffd"
    assert esc("\"'") == "&quot;&#x27;"


def test_large_world_draws_bounded_rows_with_the_suspect():
    rows = pick_rows(10_000, frozenset({7777}))
    assert len(rows) == MAX_ROWS and 7777 in rows and rows == sorted(rows)
    assert {7776, 7778} <= set(rows)
    assert pick_rows(3, frozenset()) == [0, 1, 2]


def test_segments_merge_runs_and_name_a_stop():
    s = samples(1, stop_at=T0 + 2, end=T0 + 4, state_after=ChildState.STOPPED)
    kinds = [seg.kind for seg in segments(s)]
    assert kinds == ["starting", "advancing", "stopped"]


def test_history_ring_round_trip_and_damage(tmp_path):
    snapshot = snap(2, 5)
    w = HistoryWriter(tmp_path / "history-2.bin", slots=8)
    for _ in range(20):
        w.append(snapshot)
    w.close()
    data = (tmp_path / "history-2.bin").read_bytes()
    assert len(data) == len(encode_header(8)) + 8 * 36
    got, problems = decode_history(data)
    assert [s.seq for s in got] == list(range(13, 21)) and not problems
    assert got[0].coll_entered == snapshot.coll_entered and got[0].opt_steps == 5
    broken = bytearray(data)
    broken[slot_offset(15, 8) + 10] ^= 0xFF
    got, problems = decode_history(bytes(broken))
    assert 15 not in [s.seq for s in got] and problems
    assert decode_history(b"junk")[0] == () and decode_history(b"\x00" * 64)[1]
    claims = bytearray(encode_header(8))
    claims[8:12] = (10**6).to_bytes(4, "little")
    assert "claims" in decode_history(bytes(claims))[1][0]


@pytest.mark.parametrize("hostile", [EVIL, "x" * 100_000])
def test_acceptance_page(hostile):
    report = AcceptanceReport(
        title="scout acceptance",
        cluster="lab",
        started_at=T0,
        finished_at=T0 + 300,
        checks=(
            AcceptanceCheck("1. training across two nodes", True, "2 nodes x 2 ranks", "12 s"),
            AcceptanceCheck("3. slow link", None, hostile),
            AcceptanceCheck("4. stall named", False, "named rank 2, expected rank 1"),
        ),
        cases=(
            LatencyCase(
                "stall", "rank 1 on n1, hang", "rank 1 on n1 (hang)", True, 6.2, 7.0, job_id=5
            ),
            LatencyCase(hostile, "rank 0", "nobody", False, None, 3.5),
        ),
        incidents=(hang_bundle(), hang_bundle(evil=True)),
        notes=(hostile,),
    )
    page = render_acceptance_html(report)
    tree = parse(page)
    assert not report.passed and "FAILED" in page
    assert not [t for t, a in tree.tags if t in ("script", "img")]
    assert len([a for t, a in tree.tags if t == "section"]) == 2
    assert len([a for t, a in tree.tags if t == "g" and a.get("class") == "case"]) == 2
    assert len(page) < 400_000


# -------------------------------------------------------------------------------------------
# From the evidence folder: the bundle reader, `scout show --html`, the controller's page
# -------------------------------------------------------------------------------------------


def write_tree(root, *, world: int = 4, forged_node: bool = False):
    """A hang of rank 1 as the job and the hooks leave it on disk (no verdict: computed on read)."""
    from scout_slurm.evidence.layout import JobFolder
    from scout_slurm.evidence.store import write_record

    b = hang_bundle(world)
    folder = JobFolder(root, "lab", 77)
    for d in (
        folder.ranks_dir(0),
        folder.progress_dir(0),
        folder.findings_dir(0),
        folder.results_dir,
    ):
        d.mkdir(parents=True, exist_ok=True)
    for r in range(world):
        p = b.evidence.places[r]
        if forged_node and r == 3:
            import dataclasses

            p = dataclasses.replace(p, node="../../etc")
        write_record(folder.rank_place_path(0, r), p)
        write_record(folder.rank_exit_path(0, r), b.evidence.exits[r])
        write_record(folder.progress_path(0, r), b.evidence.snapshots[r])
        w = HistoryWriter(folder.history_path(0, r))
        for s in b.history[r]:
            w.append(
                ProgressSnapshot(
                    rank=r,
                    node=node(r),
                    pid=1,
                    published_at=s.at,
                    child_state=s.state,
                    coll_entered=s.coll_entered,
                    coll_completed=s.coll_completed,
                    in_collective=s.in_collective,
                    current_op="all_reduce",
                    opt_steps=s.opt_steps,
                    pg_seq=0,
                    idle_s=0.0,
                    step_time_s=0.1,
                )
            )
        w.close()
    write_record(folder.stall_decision_path(0), b.evidence.decision)
    for i, f in enumerate(b.evidence.findings):
        write_record(folder.findings_dir(0) / f"f-{i}.json", f)
    return folder


def test_bundle_from_the_folder_reads_histories_and_refuses_planted_ones(tmp_path):
    import os

    from scout_slurm.report.bundle_loader import load_incident_bundle

    folder = write_tree(tmp_path, forged_node=True)
    folder.history_path(0, 2).unlink()
    folder.history_path(0, 2).symlink_to("/etc/passwd")
    folder.history_path(0, 3).unlink()
    os.mkfifo(folder.history_path(0, 3))
    b = load_incident_bundle(folder, 0, wall=lambda: T0 + 20)
    assert b.verdict_computed and b.verdict.kind == VerdictKind.HANG
    assert [s.rank for s in b.verdict.suspects] == [1]
    assert sorted(b.history) == [0, 1] and len(b.history[1]) == len(hang_bundle().history[1])
    text = " ".join(b.problems)
    assert "history-2.bin" in text and "history-3.bin" in text
    assert len(b.hardware) == 4
    page = render_incident_html(b)
    rows = [a for tag, a in parse(page).tags if tag == "g" and "rank-row" in a.get("class", "")]
    assert len(rows) == 4 and "history-2.bin" in page


def test_scout_show_html_writes_the_page(tmp_path):
    from click.testing import CliRunner

    from scout_slurm.cli import main

    folder = write_tree(tmp_path / "evidence")
    cfg = tmp_path / "scout.toml"
    cfg.write_text(f'[evidence]\nroot = "{tmp_path / "evidence"}"\n')
    out = tmp_path / "page.html"
    res = CliRunner().invoke(main, ["show", "77", "--html", "-o", str(out), "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    page = out.read_text()
    assert (
        page.startswith("<!DOCTYPE html>")
        and "job 77, run 0" in page
        and 'class="timeline"' in page
    )
    res = CliRunner().invoke(main, ["show", "77", "--html", "--config", str(cfg)])
    assert res.exit_code == 0 and res.output.startswith("<!DOCTYPE html>")
    res = CliRunner().invoke(main, ["show", "77", "-o", str(out), "--config", str(cfg)])
    assert res.exit_code == 1 and "goes with --html" in res.output
    res = CliRunner().invoke(
        main, ["show", "77", "--html", "-o", str(tmp_path / "no" / "p.html"), "--config", str(cfg)]
    )
    assert res.exit_code == 1 and "cannot write" in res.output
    assert folder.path.is_dir()


def test_the_controller_writes_the_page_and_survives_when_it_cannot(tmp_path):
    from scout_slurm.evidence.gather import gather_evidence
    from scout_slurm.incident.report import write_report as _write_report
    from scout_slurm.localise.verdict import localise

    folder = write_tree(tmp_path)
    ev = gather_evidence(folder, 0)
    v = localise(ev, now=T0 + 20)
    record = hang_bundle().actions
    _write_report(folder, 0, v, ev, record)
    page = folder.report_html_path(0).read_text()
    assert 'data-rank="1"' in page and "drained" in page
    md = folder.report_path(0).read_text()
    assert "## Detection latency" in md and "| detection | 5.90 s |" in md
    assert "| 1 | n1 | host-n1 | GPU-0001 |" in md and "**suspect**, drained" in md
    # a page that cannot be written costs nothing but the page: the Markdown report is still there
    folder.report_html_path(0).unlink()
    folder.report_html_path(0).mkdir()
    folder.report_path(0).unlink()
    _write_report(folder, 0, v, ev, record)
    assert "rank 1" in folder.report_path(0).read_text()


def test_the_page_renders_in_headless_chromium(tmp_path):
    """The timeline and tables of a synthetic hang, laid out and painted by a real browser."""
    import time

    from browser import assert_incident_page_renders

    started = time.monotonic()
    m = assert_incident_page_renders(
        render_incident_html(hang_bundle()), tmp_path, world=4, suspects={1}
    )
    # the suspect stopped first: its last bar of progress ends left of its peers'
    ends = {
        r["rank"]: max(b["box"][0] + b["box"][2] for b in r["bars"] if "advancing" in b["kind"])
        for r in m["rows"]
    }
    assert ends[1] < min(ends[r] for r in (0, 2, 3)), ends
    print(f"\nchromium check {time.monotonic() - started:.1f} s, pixels {m['pixels']}")


def test_the_acceptance_page_renders_in_headless_chromium(tmp_path):
    """Latency bars proportional to the seconds, one row per step, and each case's incident."""
    from browser import measure

    report = AcceptanceReport(
        title="scout acceptance",
        cluster="lab",
        started_at=T0,
        finished_at=T0 + 300,
        checks=(
            AcceptanceCheck("1. training across two nodes", True, "2 nodes x 2 ranks"),
            AcceptanceCheck("3. slow link", None, "the lab cannot shape a link"),
        ),
        cases=(
            LatencyCase("stall", "rank 1, hang", "rank 1 (hang)", True, 6.0, 7.5),
            LatencyCase("crash", "rank 3, crash", "rank 3 (crash)", True, 0.5, 3.0),
        ),
        incidents=(hang_bundle(),),
    )
    m = measure(render_acceptance_html(report), tmp_path)
    assert [len(c["bars"]) for c in m["cases"]] == [2, 2]
    (d1, l1), (d2, l2) = ([b[2] for b in c["bars"]] for c in m["cases"])
    assert l1 > d1 > l2 > d2 > 0
    assert abs(d1 / l1 - 6.0 / 7.5) < 0.02
    assert len(m["checks"]) == 3 and all(
        w > 0 and h > 0 for row in m["checks"] for _, _, w, h in row
    )
    assert len(m["rows"]) == 4 and [r["rank"] for r in m["rows"] if r["suspect"]] == [1]


def test_markdown_report_keeps_hostile_text_inside_its_cells():
    from scout_slurm.report.markdown import render_incident_markdown

    b = hang_bundle(evil=True)
    b = IncidentBundle(
        **{
            **b.__dict__,
            "hardware": tuple(
                RankMapRow(
                    rank=r.rank,
                    local_rank=r.local_rank,
                    node=r.node,
                    hostname="a|b\nc",
                    gpu_uuids=r.gpu_uuids,
                    gpu_serials=("`x`",),
                    nic=r.nic,
                )
                for r in b.hardware
            ),
        }
    )
    md = render_incident_markdown(b.verdict, b.evidence, b.actions, bundle=b)
    table = md.split("## Suspects on the hardware")[1].split("## Actions")[0]
    rows = [ln for ln in table.splitlines() if ln.startswith("| ")]
    assert len(rows) == 5
    # every row has the header's 7 columns: no cell broke out with a | or a newline
    assert all(len(re.split(r"(?<!\\)\|", ln)) == 9 for ln in rows), rows
    assert (
        "<script" not in table
        and "\x1b" not in table
        and "\x00" not in table
        and "`x`" not in table
    )
    assert rows[1].startswith("| 1 |") and "**suspect**" in rows[1]


def test_moments_of_a_crash_without_injection_count_from_the_last_progress():
    import dataclasses

    b = hang_bundle()
    crash = ExitRecord(
        rank=1,
        node="n1",
        pid=11,
        exit_code=-1,
        signal=11,
        core_dumped=True,
        at=T0 + 6,
        killed_by_scout=False,
        last_progress=snap(1, 12),
    )
    exits = {
        r: dataclasses.replace(
            e,
            exit_code=1,
            killed_by_scout=False,
            at=T0 + 6.5,
            stderr_tail=("RuntimeError: Connection closed by peer",),
        )
        for r, e in b.evidence.exits.items()
    }
    exits[1] = crash
    ev = dataclasses.replace(b.evidence, exits=exits, decision=None, findings=())
    v = dataclasses.replace(b.verdict, kind=VerdictKind.CRASH, created_at=T0 + 9)
    m = incident_moments(dataclasses.replace(b, evidence=ev, verdict=v))
    assert m.fault_at == 0.0 and m.detected_at == T0 + 6 and m.verdict_at == T0 + 9
    assert m.origin == m.last_advance_at == T0 + 4.5
    assert [p[0] for p in m.phases()][:2] == ["last progress -> detection", "detection -> verdict"]
    page = render_incident_html(dataclasses.replace(b, evidence=ev, verdict=v))
    exits_drawn = re.findall(r'<path class="exit"[^>]*stroke="(#[0-9a-f]+)"', page)
    assert (
        exits_drawn.count("#b71c1c") == 1 and exits_drawn.count("#ef6c00") == 3
    )  # the crash red, cascades orange


def test_scout_show_says_why_an_actions_file_cannot_be_read(tmp_path):
    """An actions file an older scout wrote (schema 1, prose actions) or a damaged one: the verdict
    and timeline are still shown, with one line saying why there are no actions (issue 20)."""
    import json

    from click.testing import CliRunner

    from scout_slurm.cli import main

    folder = write_tree(tmp_path / "evidence")
    folder.actions_path(0).write_text(
        json.dumps(
            {
                "record_kind": "actions",
                "schema_version": 1,
                "job_id": 77,
                "restart": 0,
                "verdict_kind": "hang",
                "status": "done",
                "held_back": [],
                "results": [],
                "created_at": 1.0,
                "updated_at": 1.0,
                "actions": [{"kind": "requeue", "target": "77", "detail": ""}],
            }
        )
    )
    cfg = tmp_path / "scout.toml"
    cfg.write_text(f'[evidence]\nroot = "{tmp_path / "evidence"}"\n')
    res = CliRunner().invoke(main, ["show", "77", "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    assert "verdict: hang" in res.output
    assert (
        "actions: not readable:" in res.output
        and "schema_version 1 was written by an older scout" in res.output
    )
    res = CliRunner().invoke(main, ["show", "77", "--json", "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    shown = json.loads(res.output)
    assert shown["actions"] is None and "older scout" in shown["actions_problem"]
