"""Open an HTML page in headless Chromium (Debian's `chromium`) and report what it rendered:
the boxes of the timeline rows and bars and of the hardware table's cells, measured by the
browser's own layout (getBoundingClientRect), and a screenshot decoded here (PNG with zlib, no
new dependency) to check that the timeline area is really painted.

The page itself carries no script and a Content-Security-Policy that forbids one; the measuring
copy drops that policy and appends the measuring script. Layout is the same either way (the
policy only forbids fetching and running things); the screenshot is taken of the page as shipped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest

_MEASURE = """<script>
(function () {
  const q = (root, s) => Array.from(root.querySelectorAll(s));
  const box = e => { const r = e.getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; };
  const out = {
    timeline: q(document, 'svg.timeline').map(box),
    rows: q(document, 'svg.timeline g.rank-row').map(g => ({
      rank: Number(g.getAttribute('data-rank')),
      suspect: g.classList.contains('suspect'),
      box: box(g),
      bars: q(g, 'rect.bar').map(b => ({kind: b.getAttribute('class'), box: box(b)}))})),
    moments: q(document, 'svg.timeline g.moment').map(g => ({name: g.getAttribute('data-moment'),
                                                             box: box(g.querySelector('line'))})),
    phases: q(document, 'svg.phases rect.bar').map(box),
    table: q(document, 'table.hwmap tr').map(tr => ({
      rank: tr.getAttribute('data-rank'),
      cls: tr.className,
      cells: Array.from(tr.children).map(td => ({box: box(td), text: td.textContent}))})),
    cases: q(document, 'svg#latency g.case').map(g => ({ok: g.getAttribute('data-ok'),
                                                       bars: q(g, 'rect.bar').map(box)})),
    checks: q(document, 'table#checks tr').map(tr => Array.from(tr.children).map(box)),
  };
  const pre = document.createElement('pre');
  pre.id = 'scout-measure';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""
_CSP = re.compile(r'<meta http-equiv="Content-Security-Policy"[^>]*>')


def chromium() -> str:
    """The Chromium binary, or skip the test with the reason (scripts/setup.sh installs it)."""
    path = shutil.which("chromium") or (
        "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None
    )
    if path is None:
        pytest.skip(
            "chromium is not installed (Debian package `chromium`; scripts/setup.sh installs it)"
        )
    return path


def _run(args: list[str], tmp: Path, timeout: float = 90) -> subprocess.CompletedProcess:
    # a private profile and HOME: nothing of a user's browser is read or written
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp), "LANG": "C.UTF-8"}
    return subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--disable-extensions",
            "--force-device-scale-factor=1",
            f"--user-data-dir={tmp / 'profile'}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def measure(page: str, tmp: Path) -> dict:
    """Layout boxes of the page's timeline and tables, as Chromium computed them."""
    tmp.mkdir(parents=True, exist_ok=True)
    copy = tmp / "measure.html"
    text, n = _CSP.subn("", page, count=1)
    assert n == 1, "the page lost its Content-Security-Policy"
    copy.write_text(text.replace("</body>", _MEASURE + "</body>"), encoding="utf-8")
    res = _run(["--window-size=1100,900", "--dump-dom", copy.as_uri()], tmp)
    m = re.search(r'<pre id="scout-measure">(.*?)</pre>', res.stdout, re.S)
    assert m, (
        f"chromium did not run the measuring script (rc {res.returncode}):\n{res.stderr[-2000:]}"
    )
    import html

    return json.loads(html.unescape(m.group(1)))


@dataclass(frozen=True)
class Image:
    width: int
    height: int
    channels: int
    pixels: bytes  # rows of width * channels bytes, unfiltered

    def pixel(self, x: int, y: int) -> tuple[int, ...]:
        i = (y * self.width + x) * self.channels
        return tuple(self.pixels[i : i + 3])


def decode_png(data: bytes) -> Image:
    """8-bit RGB or RGBA, not interlaced (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, [], None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + length
    assert header is not None
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    ch = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = width * ch
    out = bytearray(height * stride)
    prev = bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        if f == 1:
            for i in range(ch, stride):
                line[i] = (line[i] + line[i - ch]) & 255
        elif f == 2:
            line = bytearray((a + b) & 255 for a, b in zip(line, prev))
        elif f == 3:
            for i in range(stride):
                left = line[i - ch] if i >= ch else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 255
        elif f == 4:
            for i in range(stride):
                a = line[i - ch] if i >= ch else 0
                b, c = prev[i], (prev[i - ch] if i >= ch else 0)
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out[y * stride : (y + 1) * stride] = line
        prev = line
    return Image(width, height, ch, bytes(out))


def screenshot(page: str, tmp: Path, *, width: int, height: int) -> Image:
    """The page as shipped (its policy on, no script), painted by Chromium."""
    tmp.mkdir(parents=True, exist_ok=True)
    src, png = tmp / "page.html", tmp / "shot.png"
    src.write_text(page, encoding="utf-8")
    res = _run([f"--window-size={width},{height}", f"--screenshot={png}", src.as_uri()], tmp)
    assert png.exists(), (
        f"chromium wrote no screenshot (rc {res.returncode}):\n{res.stderr[-2000:]}"
    )
    return decode_png(png.read_bytes())


def count_colour(img: Image, box: list[float], rgb: tuple[int, int, int], tol: int = 12) -> int:
    x0, y0, w, h = (int(v) for v in box)
    n = 0
    for y in range(max(0, y0), min(img.height, y0 + h)):
        for x in range(max(0, x0), min(img.width, x0 + w)):
            p = img.pixel(x, y)
            if all(abs(p[i] - rgb[i]) <= tol for i in range(3)):
                n += 1
    return n


def assert_incident_page_renders(page: str, tmp: Path, *, world: int, suspects: set[int]) -> dict:
    """The timeline and the tables rendered: one row per rank, top to bottom in rank order, each
    with painted bars inside the chart; the suspects' rows highlighted; the detection before the
    verdict; one table row per rank with every cell laid out; the timeline's pixels painted in the
    colours of progress and of the suspect's band. Returns the measurements."""
    m = measure(page, tmp)
    assert len(m["timeline"]) == 1
    tx, ty, tw, th = m["timeline"][0]
    assert tw > 500 and th > 40, m["timeline"]
    rows = m["rows"]
    assert [r["rank"] for r in rows] == list(range(world)), rows
    assert {r["rank"] for r in rows if r["suspect"]} == suspects
    ys = [r["box"][1] for r in rows]
    assert ys == sorted(ys) and len(set(ys)) == len(ys), ys
    for r in rows:
        bars = [b["box"] for b in r["bars"]]
        assert bars, f"rank {r['rank']}: no bar drawn"
        for x, _y, w, h in bars:
            assert w >= 1 and h >= 5 and tx - 1 <= x and x + w <= tx + tw + 1, (r["rank"], bars)
        assert any("advancing" in b["kind"] for b in r["bars"]), r
    names = [mo["name"] for mo in m["moments"]]
    assert "detection" in names and "verdict" in names, names
    xs = {mo["name"]: mo["box"][0] for mo in m["moments"]}
    assert xs["detection"] <= xs["verdict"] + 0.5, xs
    assert m["phases"] and all(b[2] > 0 for b in m["phases"])
    table = m["table"]
    assert len(table) == world + 1, table
    for tr in table:
        assert all(c["box"][2] > 0 and c["box"][3] > 0 for c in tr["cells"]), tr
    assert {int(tr["rank"]) for tr in table[1:] if "suspect" in tr["cls"]} == suspects
    # pixels of the page as shipped: progress green and the suspect's band are painted in the
    # timeline
    img = screenshot(page, tmp, width=1100, height=int(ty + th + 20))
    green = count_colour(img, [tx, ty, tw, th], (0x2E, 0x7D, 0x32))
    band = count_colour(img, [tx, ty, tw, th], (0xFD, 0xEC, 0xEA))
    assert green > 200 * world, green
    assert band > 100 * len(suspects), band
    m["pixels"] = {"green": green, "band": band}
    return m


def check_real_incident(
    lab, job_id: int, tmp: Path, *, restart: int, world: int, suspects: set[int]
) -> dict:
    """A real incident's page, from `scout show JOBID --html -o FILE` and from the controller's
    bundle: the watchdogs kept each rank's history, and Chromium renders the timeline and tables."""
    import sys

    from scout_slurm.evidence.history import decode_history
    from scout_slurm.evidence.layout import JobFolder
    from scout_slurm.lab.cluster import CLUSTER_NAME

    folder = JobFolder(lab.paths.evidence, CLUSTER_NAME, job_id)
    for r in range(world):
        samples, problems = decode_history(folder.history_path(restart, r).read_bytes())
        assert len(samples) >= 4 and not problems, (r, len(samples), problems)
        assert [s.seq for s in samples] == sorted(s.seq for s in samples)
        assert (
            samples[-1].coll_completed >= samples[0].coll_completed
            and samples[-1].coll_completed > 0
        )
    kept = folder.report_html_path(restart).read_text(encoding="utf-8")
    assert kept.count('class="rank-row') == world and "badge drained" in kept, kept[:2000]
    tmp.mkdir(parents=True, exist_ok=True)
    out = tmp / f"incident-{job_id}.html"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "scout_slurm.cli",
            "show",
            str(job_id),
            "--restart",
            str(restart),
            "--html",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=lab.client_env(),
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return assert_incident_page_renders(
        out.read_text(encoding="utf-8"), tmp, world=world, suspects=suspects
    )
