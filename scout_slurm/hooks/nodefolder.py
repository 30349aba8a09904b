"""A node's root-owned folder in the job's evidence folder, `nodes/<node>/`, created by the root
hooks that write there (the node Epilog, its checkpoint checks) with no link followed below the
evidence root. The function that reaches outside is `ensure_node_dir`."""

from __future__ import annotations

import os
from pathlib import Path

from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.safeio import Owner, UnsafeFolder, ensure_dir


def ensure_node_dir(folder: JobFolder, node: str) -> Path:
    """This node's folder, created if missing, with no link followed below the evidence root (where
    the Prolog did not lay out the job's folders, the job may have planted one). The root itself
    must exist: creating it would fill the local disk under a shared file system that failed to
    mount."""
    from scout_slurm.hooks.prolog import ROOT_DIR_MODE

    root_owner = Owner(0, 0, ROOT_DIR_MODE)
    try:
        fds = [os.open(folder.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
    except OSError as exc:
        raise UnsafeFolder(
            f"evidence root {folder.root} does not exist or cannot be opened "
            f"({exc.strerror or exc}): mount it, or fix [evidence] root in the site config"
        ) from None
    try:
        for name, shown in (
            (folder.cluster, folder.cluster_dir),
            (str(folder.job_id), folder.path),
            (folder.nodes_dir.name, folder.nodes_dir),
            (node, folder.node_dir(node)),
        ):
            fds.append(ensure_dir(fds[-1], name, root_owner, shown))
    finally:
        for fd in fds:
            os.close(fd)
    return folder.node_dir(node)
