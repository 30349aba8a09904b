"""Pure parsers for what Slurm prints (22.05, 24.11, 26.05, recorded in tests/fixtures/slurm-*):
`squeue --json`, the node listings `sinfo --json` (22.05) and `scontrol show node --json` (23.02+),
`scontrol show job -o` / `show node -o`. Text or JSON in, typed records out. Where a field's shape
changed between releases it is read by shape; which command a release needs is
`versions.Dialect`."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scout_slurm.errors import SlurmError
from scout_slurm.slurm.hostlist import expand_hostlist

_INT_TEXT = re.compile(r"-?[0-9]+")  # not str.isdigit: it accepts '²', which int() refuses
# scontrol -o prints a multi-line node reason as `line1 [user@time]` then each further line
# after one space and seven more: put the lines back together and drop the stamp
_REASON_STAMP = re.compile(r" \[[^\[\]\s]+@[^\[\]\s]+\](?=$| {8})")

FINISHED_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
    }
)


@dataclass(frozen=True)
class JobInfo:
    job_id: int
    name: str
    state: str  # RUNNING, PENDING, COMPLETED, ...
    nodes: tuple[str, ...]  # expanded
    batch_host: str
    excluded_nodes: tuple[str, ...]
    restart_count: int
    requeue: bool
    exit_code: int  # raw wait status as Slurm reports it
    comment: str
    user_id: int
    reason: str = ""

    @property
    def is_finished(self) -> bool:
        return self.state in FINISHED_STATES


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str  # base state: IDLE, ALLOCATED, MIXED, DOWN, ...
    flags: tuple[str, ...]  # DRAIN, COMPLETING, NOT_RESPONDING, ...
    reason: str
    hostname: str
    address: str

    @property
    def state_text(self) -> str:
        return "+".join((self.state, *self.flags))

    @property
    def is_drained(self) -> bool:
        return "DRAIN" in self.flags

    @property
    def is_idle(self) -> bool:
        return self.state == "IDLE" and not self.flags


def _load_json(text: str, what: str) -> Mapping[str, Any]:
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:  # RecursionError: nested too deeply
        raise SlurmError(
            f"{what}: output is not JSON ({exc}); first bytes: {text[:200]!r}"
        ) from None
    if not isinstance(data, dict):
        raise SlurmError(f"{what}: expected a JSON object, got {type(data).__name__}")
    errors = data.get("errors") or []
    if errors:
        raise SlurmError(f"{what}: Slurm reported errors: {errors!r}"[:2000])
    return data


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ("" if v is None else str(v))


def _int(v: Any, default: int = 0) -> int:
    # 22.05 prints plain ints; later versions wrap as {"set": true, "number": N}
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, Mapping):
        if v.get("set") is False or v.get("infinite"):
            return default
        v = v.get("number")  # wrapped once, never deeper
        return v if isinstance(v, int) and not isinstance(v, bool) else default
    if isinstance(v, str) and _INT_TEXT.fullmatch(v.strip()):
        return int(v)
    return default


def _wait_status(v: Any) -> int:
    """The exit code as a raw wait status: 22.05 prints it so; 23.02+ print
    {"status": [...], "return_code": N, "signal": {"id": N, "name": ...}} (N possibly wrapped)."""
    if isinstance(v, Mapping) and ("return_code" in v or "signal" in v):
        sig = v.get("signal")
        signal = _int(sig.get("id")) if isinstance(sig, Mapping) else _int(sig)
        return (_int(v.get("return_code")) & 0xFF) << 8 | (signal & 0x7F)
    return _int(v)


def _state(v: Any) -> tuple[str, tuple[str, ...]]:
    if isinstance(v, list):  # later versions: ["IDLE", "DRAIN"]
        parts = [_str(x).upper() for x in v]
        return (parts[0] if parts else "UNKNOWN"), tuple(parts[1:])
    return _str(v).upper() or "UNKNOWN", ()


def parse_squeue_json(text: str) -> list[JobInfo]:
    data = _load_json(text, "squeue --json")
    jobs = data.get("jobs")
    if not isinstance(jobs, list):
        raise SlurmError("squeue --json: no 'jobs' list in the output")
    out = []
    for j in jobs:
        if not isinstance(j, Mapping):
            continue
        state, _ = _state(j.get("job_state"))
        out.append(
            JobInfo(
                job_id=_int(j.get("job_id")),
                name=_str(j.get("name")),
                state=state,
                nodes=tuple(expand_hostlist(_str(j.get("nodes")))),
                batch_host=_str(j.get("batch_host")),
                excluded_nodes=tuple(expand_hostlist(_str(j.get("excluded_nodes")))),
                restart_count=_int(j.get("restart_cnt")),
                requeue=bool(j.get("requeue", True)),
                exit_code=_wait_status(j.get("exit_code")),
                comment=_str(j.get("comment")),
                user_id=_int(j.get("user_id"), -1),
                reason=_str(j.get("state_reason")),
            )
        )
    return out


def parse_sacct_state(text: str, job_id: int) -> str:
    """The state of `job_id`'s newest record in `sacct -P -n -o JobID,State` output (pure):
    "CANCELLED by
    1001" gives CANCELLED; steps (`ID.batch`) are not the job; "" when the job is not listed."""
    state = ""
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) >= 2 and fields[0] == str(job_id) and fields[1].strip():
            state = fields[1].split()[0].upper()
    return state


def parse_sinfo_json(text: str, what: str = "sinfo --json") -> list[NodeInfo]:
    """One record per node from a listing with a "nodes" list: 22.05's `sinfo --json`, and
    `scontrol show node --json` of later releases (their `sinfo --json` groups nodes instead)."""
    data = _load_json(text, what)
    nodes = data.get("nodes")
    if not isinstance(nodes, list):
        hint = (
            " (from 23.02 on the per-node listing is `scontrol show node --json`)"
            if "sinfo" in data
            else ""
        )
        raise SlurmError(f"{what}: no 'nodes' list in the output{hint}")
    out = []
    for n in nodes:
        if not isinstance(n, Mapping):
            continue
        state, extra = _state(n.get("state"))
        raw_flags = n.get("state_flags")
        raw_flags = raw_flags if isinstance(raw_flags, list) else [raw_flags] if raw_flags else []
        flags = tuple(_str(f).upper() for f in raw_flags) + extra
        out.append(
            NodeInfo(
                name=_str(n.get("name")),
                state=state,
                flags=flags,
                reason=_str(n.get("reason")),
                hostname=_str(n.get("hostname")),
                address=_str(n.get("address")),
            )
        )
    return out


# `scontrol show ... -o`: one record per line, `Key=Value` pairs separated by spaces; values may
# contain spaces only in a few known trailing keys (Reason=, Comment=, Command=...), which Slurm
# prints last or which run until the next known `Key=`.


def parse_scontrol_oneliner(line: str) -> dict[str, str]:
    """One `key=value` line into a dict; a value runs until the next ` Key=` token."""
    out: dict[str, str] = {}
    tokens = line.strip().split(" ")
    key = None
    for tok in tokens:
        eq = tok.find("=")
        if (
            eq > 0
            and tok[:eq].replace("_", "").replace(":", "").replace("/", "").isalnum()
            and tok[0].isupper()
        ):
            key = tok[:eq]
            out[key] = tok[eq + 1 :]
        elif key is not None:
            out[key] += " " + tok
    return out


def parse_scontrol_job(text: str) -> list[JobInfo]:
    out = []
    for line in text.splitlines():
        if not line.strip() or not line.lstrip().startswith("JobId="):
            continue
        kv = parse_scontrol_oneliner(line)
        state = kv.get("JobState", "UNKNOWN").upper()
        ec = kv.get("ExitCode", "0:0")
        try:
            code, sig = (int(x) for x in ec.split(":", 1))
        except ValueError:
            code, sig = 0, 0
        nodelist = kv.get("NodeList", "")
        out.append(
            JobInfo(
                job_id=_int(kv.get("JobId")),
                name=kv.get("JobName", ""),
                state=state,
                nodes=tuple(expand_hostlist("" if nodelist in ("(null)", "") else nodelist)),
                batch_host=kv.get("BatchHost", ""),
                excluded_nodes=tuple(
                    expand_hostlist(
                        "" if kv.get("ExcNodeList", "(null)") == "(null)" else kv["ExcNodeList"]
                    )
                ),
                restart_count=_int(kv.get("Restarts")),
                requeue=kv.get("Requeue", "1") == "1",
                exit_code=(code << 8) | sig,
                comment="" if kv.get("Comment", "(null)") == "(null)" else kv.get("Comment", ""),
                user_id=_int(kv.get("UserId", "").split("(")[-1].rstrip(")"), -1),
                reason=kv.get("Reason", ""),
            )
        )
    return out


def parse_scontrol_node(text: str) -> list[NodeInfo]:
    out = []
    for line in text.splitlines():
        if not line.lstrip().startswith("NodeName="):
            continue
        kv = parse_scontrol_oneliner(line)
        parts = kv.get("State", "UNKNOWN").upper().split("+")
        reason = _scontrol_reason(kv.get("Reason", ""))
        out.append(
            NodeInfo(
                name=kv.get("NodeName", ""),
                state=parts[0],
                flags=tuple(parts[1:]),
                reason="" if reason == "(null)" else reason,
                hostname=kv.get("NodeHostName", ""),
                address=kv.get("NodeAddr", ""),
            )
        )
    return out


def _scontrol_reason(text: str) -> str:
    """The reason the operator set, from scontrol's `first line [user@time]        next line`."""
    m = _REASON_STAMP.search(text)
    if not m:
        return text
    first, rest = text[: m.start()], text[m.end() :]
    return "\n".join([first, *rest.split(" " * 8)[1:]])  # rest is empty or starts with the 8 spaces


def format_reason(reason: str, *, limit: int = 1000) -> str:
    """A drain reason safe to pass as one argv element: printable, one line, bounded."""
    clean = "".join(ch if ch.isprintable() else " " for ch in reason).replace("\n", " ")
    return clean[:limit]


# `scontrol show config` prints "Key<spaces>= value", one per line, after a heading; later
# sections (cgroup.conf, the controllers' state) follow. A key's first occurrence is slurm.conf's.
# From 24.11 a hook's programs are numbered, one line each ("Prolog[0] = ..."): 22.05 prints
# "Prolog = ..." (tests/fixtures/slurm-*/scontrol-show-config.txt).
_CONFIG_LINE = re.compile(r"^([A-Za-z][A-Za-z0-9_]*(?:\[\d+\])?)\s*= ?(.*)$")
_INDEXED = re.compile(r"^([A-Za-z][A-Za-z0-9_]*)\[(\d+)\]$")
_SECONDS = re.compile(r"^(\d+)(?: sec)?$")
NO_VAL16 = 65534  # what Slurm prints for a timeout left unset: no limit


@dataclass(frozen=True)
class SlurmSettings:
    """What `scout site check` reads of `scontrol show config`. A hook parameter Slurm shows as
    `(null)` is (); several programs (numbered lines, 24.11 on) are one entry each."""

    version: str  # SLURM_VERSION, "22.05.8"
    cluster_name: str
    slurm_user: str  # the name of SlurmUser, without the "(uid)" scontrol adds
    slurm_user_uid: int | None
    prolog: tuple[str, ...]
    epilog: tuple[str, ...]
    epilog_slurmctld: tuple[str, ...]
    prolog_flags: tuple[str, ...]
    # (parameter, seconds) Slurm kills the Prolog / the Epilogs at: PrologTimeout and
    # EpilogTimeout (26.05) where set, else PrologEpilogTimeout; seconds None: no limit
    prolog_timeout: tuple[str, int | None]
    epilog_timeout: tuple[str, int | None]
    min_job_age_s: int | None
    raw: Mapping[str, str]

    @property
    def release(self) -> tuple[int, int] | None:
        m = re.match(r"(\d+)\.(\d+)", self.version)
        return (int(m[1]), int(m[2])) if m else None


def _programs(raw: Mapping[str, str], name: str) -> tuple[str, ...]:
    """The programs of hook `name`: "Name = a" (22.05, maybe "a,b") or "Name[0] = a" lines."""
    values = [raw.get(name, "")]
    numbered = sorted(
        (int(m[2]), v) for k, v in raw.items() if (m := _INDEXED.match(k)) and m[1] == name
    )
    values += [v for _, v in numbered]
    return tuple(
        p.strip() for v in values if v not in ("", "(null)") for p in v.split(",") if p.strip()
    )


def _seconds(value: str) -> int | None:
    m = _SECONDS.match(value.strip())
    return int(m[1]) if m else None


def _timeout(raw: Mapping[str, str], own: str) -> tuple[str, int | None]:
    name = own if _seconds(raw.get(own, "")) is not None else "PrologEpilogTimeout"
    seconds = _seconds(raw.get(name, ""))
    return name, None if seconds in (None, NO_VAL16) else seconds


def parse_show_config(text: str) -> SlurmSettings:
    """`scontrol show config` (recorded: tests/fixtures/slurm-*/scontrol-show-config.txt)."""
    raw: dict[str, str] = {}
    for line in text.splitlines():
        m = _CONFIG_LINE.match(line)
        if m and m[1] not in raw:
            raw[m[1]] = m[2].strip()
    if "SLURM_VERSION" not in raw:
        raise SlurmError(
            "`scontrol show config` printed no SLURM_VERSION line: is this its output? "
            f"first line: {text.strip().splitlines()[0][:200] if text.strip() else '(empty)'!r}"
        )
    user = raw.get("SlurmUser", "")
    m = re.fullmatch(r"(.*?)\((\d+)\)", user)
    name, uid = (m[1], int(m[2])) if m else (user, None)
    return SlurmSettings(
        version=raw["SLURM_VERSION"],
        cluster_name=raw.get("ClusterName", ""),
        slurm_user=name,
        slurm_user_uid=uid,
        prolog=_programs(raw, "Prolog"),
        epilog=_programs(raw, "Epilog"),
        epilog_slurmctld=_programs(raw, "EpilogSlurmctld"),
        prolog_flags=tuple(
            f.strip()
            for f in raw.get("PrologFlags", "").split(",")
            if f.strip() not in ("", "(null)")
        ),
        prolog_timeout=_timeout(raw, "PrologTimeout"),
        epilog_timeout=_timeout(raw, "EpilogTimeout"),
        min_job_age_s=_seconds(raw.get("MinJobAge", "")),
        raw=raw,
    )
