"""Slurm hostlist expressions (`n[1-4,7]`, `gpu[01-03]-ib,login1`) both ways (pure)."""

from __future__ import annotations

import re

from scout_slurm.errors import SlurmError

_NAME_OK = re.compile(r"^[A-Za-z0-9._-]+\Z")  # \Z, not $: "$" also matches before a final newline
_NUMBER = re.compile(
    r"[0-9]{1,18}"
)  # not str.isdigit: it accepts '²', which int() refuses; nor 5000 digits
MAX_HOSTS = 1_000_000


def _split_top(expr: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in expr:
        if ch == "[":
            depth += 1
            if depth > 1:
                raise SlurmError(f"hostlist {expr!r}: nested brackets are not valid")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise SlurmError(f"hostlist {expr!r}: unbalanced ']'")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise SlurmError(f"hostlist {expr!r}: unbalanced '['")
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def expand_hostlist(expr: str) -> list[str]:
    """`n[1-3,7]` -> ['n1','n2','n3','n7']; keeps order, zero padding and duplicates out."""
    if expr is None:
        return []
    expr = expr.strip()
    if not expr or expr in ("(null)", "None"):
        return []
    out: list[str] = []
    seen = set()
    for part in _split_top(expr):
        for host in _expand_one(part, expr):
            if host not in seen:
                seen.add(host)
                out.append(host)
                if len(out) > MAX_HOSTS:
                    raise SlurmError(f"hostlist {expr[:80]!r}: more than {MAX_HOSTS} hosts")
    return out


def _expand_one(part: str, whole: str) -> list[str]:
    m = re.fullmatch(r"([^\[\]]*)\[([^\[\]]+)\]([^\[\]]*)(.*)", part)
    if not m:
        if not _NAME_OK.match(part):
            raise SlurmError(f"hostlist {whole!r}: {part!r} is not a valid host name")
        return [part]
    prefix, ranges, suffix, rest = m.groups()
    hosts = []
    for r in ranges.split(","):
        r = r.strip()
        if "-" in r:
            lo, hi = r.split("-", 1)
            if not (_NUMBER.fullmatch(lo) and _NUMBER.fullmatch(hi)):
                raise SlurmError(
                    f"hostlist {whole[:80]!r}: range {r[:40]!r} is not numeric (at most 18 digits)"
                )
            width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
            a, b = int(lo), int(hi)
            if b < a:
                raise SlurmError(f"hostlist {whole!r}: range {r!r} runs backwards")
            if b - a > MAX_HOSTS:
                raise SlurmError(f"hostlist {whole!r}: range {r!r} is too large")
            hosts.extend(f"{prefix}{str(i).zfill(width)}{suffix}" for i in range(a, b + 1))
            if len(hosts) > MAX_HOSTS:  # per range is not enough: n[0-999999,0-999999,...]
                raise SlurmError(f"hostlist {whole[:80]!r}: more than {MAX_HOSTS} hosts")
        else:
            if not _NUMBER.fullmatch(r):
                raise SlurmError(f"hostlist {whole!r}: {r!r} is not a number")
            hosts.append(f"{prefix}{r}{suffix}")
    if rest:
        # a second bracket in the same name (rack[1-2]-node[1-2]): expand recursively
        expanded = []
        for h in hosts:
            expanded.extend(_expand_one(h + rest, whole))
            if len(expanded) > MAX_HOSTS:  # a[0-999999]b[0-999999] would be 10^12 names
                raise SlurmError(f"hostlist {whole[:80]!r}: more than {MAX_HOSTS} hosts")
        hosts = expanded
    for h in hosts:
        if not _NAME_OK.match(h):
            raise SlurmError(f"hostlist {whole!r}: {h!r} is not a valid host name")
    return hosts


def compress_hostlist(hosts: list[str] | tuple[str, ...]) -> str:
    """['n1','n2','n3','n7'] -> 'n[1-3,7]'; names without a trailing number stay as they are."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    order: list[tuple[str, int] | str] = []
    for h in dict.fromkeys(hosts):
        if not _NAME_OK.match(h):
            raise SlurmError(f"{h!r} is not a valid host name")
        m = re.fullmatch(
            r"(.*?)([0-9]{1,18})", h
        )  # a longer number stays a plain name (int() limits)
        if not m:
            plain.append(h)
            order.append(h)
            continue
        prefix, num = m.groups()
        width = len(num) if num.startswith("0") and len(num) > 1 else 0
        key = (prefix, width)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(num))
    out = []
    for key in order:
        if isinstance(key, str):
            out.append(key)
            continue
        prefix, width = key
        nums = sorted(set(groups[key]))
        if len(nums) == 1:
            out.append(f"{prefix}{str(nums[0]).zfill(width)}")
            continue
        ranges, start, prev = [], nums[0], nums[0]
        for n in nums[1:] + [None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            a, b = str(start).zfill(width), str(prev).zfill(width)
            ranges.append(a if start == prev else f"{a}-{b}")
            if n is not None:
                start = prev = n
        out.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(out)
