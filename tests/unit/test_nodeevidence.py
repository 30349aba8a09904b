"""Kernel log records that matter to a post-mortem, from realistic /dev/kmsg records."""

from __future__ import annotations

import pytest

from scout_slurm.hooks.nodeevidence import (
    HARDWARE_CLASSES,
    MAX_LINES,
    KernelLine,
    classify_kernel_line,
    parse_kmsg,
)

# /dev/kmsg records: "prio,seq,usec,flags;text" (continuation lines " KEY=value" follow some)
XID_79 = "4,1234,5000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
XID_48 = (
    "4,1240,5100000,-;NVRM: Xid (PCI:0000:86:00): 48, pid=9021, name=python, Ch 00000008, DBE "
    "(0x00000002)"
)
FALLEN = (
    "3,1241,5200000,-;NVRM: GPU at PCI:0000:3b:00: GPU-6f0c1a77-3a7b-4c1f-b0a4-63f7e0d3a8c2 has "
    "fallen off the bus."
)
MCE = "2,2201,7300123456,-;mce: [Hardware Error]: Machine check events logged"
EDAC = (
    "3,2210,7400000000,-;EDAC MC0: 1 UE memory read error on CPU_SrcID#0_Ha#0_Chan#1_DIMM#0 "
    "(channel:1 slot:0)"
)
AER = (
    "3,2300,7500000000,-;pcieport 0000:3a:00.0: AER: Uncorrected (Fatal) error received: "
    "0000:3b:00.0"
)
PCIE = (
    "3,2301,7500000100,-;nvidia 0000:3b:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), "
    "type=Inaccessible"
)
LINK = "6,2400,7600000000,-;mlx5_core 0000:5e:00.0 ib0: Link is Down"
NIC = "6,2401,7600000100,-;ice 0000:18:00.0 ens1f0: NIC Link is Down"
OOM = (
    "4,2500,7700000000,-;python invoked oom-killer: "
    "gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), "
    "order=0, oom_score_adj=0"
)
OOM_KILL = (
    "3,2501,7700000200,-;Out of memory: Killed process 4242 (python) total-vm:91234567kB, "
    "anon-rss:81234567kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:170000kB oom_score_adj:0"
)
USB = "6,100,1000,-;usb 1-1: new high-speed USB device number 2 using xhci_hcd"
CONT = " SUBSYSTEM=pci"
CONT2 = " DEVICE=+pci:0000:3b:00.0"


@pytest.mark.parametrize(
    "record,category",
    [
        (XID_79, "nvidia-xid-bus"),
        (XID_48, "nvidia-xid-memory"),
        (FALLEN, "gpu-fallen-off"),
        (MCE, "machine-check"),
        (EDAC, "edac"),
        (AER, "pcie-aer"),
        (PCIE, "pcie-aer"),
        (LINK, "link-down"),
        (NIC, "link-down"),
        (OOM, "oom-killer"),
        (OOM_KILL, "oom-killer"),
    ],
)
def test_classify_realistic_lines(record, category):
    assert classify_kernel_line(record.partition(";")[2]) == category


@pytest.mark.parametrize(
    "text",
    [
        "usb 1-1: new high-speed USB device number 2 using xhci_hcd",
        "EXT4-fs (nvme0n1p1): mounted filesystem with ordered data mode",
        "nvidia-uvm: Loaded the UVM driver, major device number 507.",
        "aerospace aerial maced",  # words that only contain the keywords
        "",
    ],
)
def test_ordinary_lines_are_not_classified(text):
    assert classify_kernel_line(text) is None


def test_hardware_classes():
    assert {
        "nvidia-xid-memory",
        "nvidia-xid-bus",
        "nvidia-xid-nvlink",
        "nvidia-xid-thermal",
        "machine-check",
        "edac",
        "pcie-aer",
        "gpu-fallen-off",
    } == HARDWARE_CLASSES
    for not_hardware in (
        "oom-killer",
        "link-down",
        "process-fault",
        "nvidia-xid-application",
        "nvidia-xid-unknown",
        "edac-corrected",
        "pcie-aer-corrected",
    ):
        assert not_hardware not in HARDWARE_CLASSES


def test_parse_kmsg_keeps_what_matters_after_the_job_began():
    records = [USB, XID_79, CONT, CONT2, MCE, EDAC, AER, OOM, "", "garbage"]
    lines = parse_kmsg(records, since_boot_s=4.0)
    assert [ln.category for ln in lines] == [
        "nvidia-xid-bus",
        "machine-check",
        "edac",
        "pcie-aer",
        "oom-killer",
    ]
    assert lines[0] == KernelLine(
        5.0,
        "nvidia-xid-bus",
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
    )
    assert lines[1].seconds_since_boot == 7300.123456


def test_parse_kmsg_drops_records_before_the_job():
    assert parse_kmsg([XID_79, MCE], since_boot_s=6.0) == [parse_kmsg([MCE], since_boot_s=0)[0]]
    assert parse_kmsg([XID_79], since_boot_s=5.0)[0].category == "nvidia-xid-bus"  # at the start


@pytest.mark.parametrize(
    "record",
    [
        "NVRM: Xid (PCI:0000:3b:00): 79",  # no header
        "4,1234;NVRM: Xid (PCI:0000:3b:00): 79",  # too few fields
        "4,1234,abc,-;NVRM: Xid (PCI:0000:3b:00): 79",  # time not a number
        "4,1234,-5,-;NVRM: Xid (PCI:0000:3b:00): 79",
        "x,1234,5,-;NVRM: Xid (PCI:0000:3b:00): 79",  # priority not a number
        "12,1234,5,-;NVRM: Xid (PCI:0000:3b:00): 79",  # facility user: written by a process
    ],
)
def test_malformed_records_are_skipped(record):
    assert parse_kmsg([record], since_boot_s=0) == []


def test_only_the_first_line_of_a_record_and_at_most_500_characters():
    lines = parse_kmsg(
        [
            XID_79 + "\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0",
            "4,9,9000000,-;NVRM: Xid (PCI:0000:3b:00): 79, " + "x" * 2000,
        ],
        since_boot_s=0,
    )
    assert lines[0].text.endswith("fallen off the bus.")
    assert len(lines[1].text) == 500


def test_text_with_semicolons_is_kept_whole():
    (line,) = parse_kmsg(
        ["4,1,2000000,-;NVRM: Xid (PCI:0000:3b:00): 13; Graphics SM Warp Exception"], since_boot_s=0
    )
    assert line.text == "NVRM: Xid (PCI:0000:3b:00): 13; Graphics SM Warp Exception"


def test_at_most_the_last_lines_are_kept():
    records = [
        f"4,{i},{1_000_000 + i},-;NVRM: Xid (PCI:0000:3b:00): 31, pid={i}"
        for i in range(MAX_LINES + 50)
    ]
    lines = parse_kmsg(records, since_boot_s=0)
    assert len(lines) == MAX_LINES
    assert lines[0].text.endswith("pid=50") and lines[-1].text.endswith(f"pid={MAX_LINES + 49}")
