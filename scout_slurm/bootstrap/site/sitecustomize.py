"""scout-slurm bootstrap: installs scout's torch.distributed hooks when run under scout-task,
then runs the sitecustomize that this file shadows, so a site's own keeps working."""

import os
import sys

# The two settings read here are read before scout_slurm can be imported (this file runs at the
# start of every Python of the job, and finds the package through them), so they are spelt out:
# they are jobconfig.PROGRESS_DIR and jobconfig.PACKAGE_DIR, which tests/unit/test_settings.py
# checks. Every other setting is read once, by scout_slurm.jobconfig.load().
_PROGRESS_DIR = "SCOUT_PROGRESS_DIR"
_PACKAGE_DIR = "SCOUT_PACKAGE_DIR"


def _scout_install():
    if not os.environ.get(_PROGRESS_DIR):
        return
    try:
        try:
            from scout_slurm.bootstrap import patches
        except ImportError:
            import importlib.util

            pkg = os.environ.get(_PACKAGE_DIR, "")
            # Only an absolute folder that holds the package: an empty or relative value would
            # run whatever __init__.py sits in the job's working directory.
            if not os.path.isabs(pkg) or not os.path.isfile(os.path.join(pkg, "__init__.py")):
                raise ImportError(
                    f"scout_slurm is not importable and {_PACKAGE_DIR}={pkg!r} "
                    "is not a folder holding it"
                ) from None
            spec = importlib.util.spec_from_file_location(
                "scout_slurm", os.path.join(pkg, "__init__.py"), submodule_search_locations=[pkg]
            )
            if spec is None or spec.loader is None:
                raise
            module = importlib.util.module_from_spec(spec)
            sys.modules["scout_slurm"] = module
            try:
                spec.loader.exec_module(module)
                from scout_slurm.bootstrap import patches
            except BaseException:
                # leave no half-imported package behind for the job's own imports
                for name in [
                    n for n in sys.modules if n == "scout_slurm" or n.startswith("scout_slurm.")
                ]:
                    del sys.modules[name]
                raise
        from scout_slurm import jobconfig

        patches.install_from_config(jobconfig.load())  # the one read of the job's settings
    except Exception as exc:  # the training job must run even if scout cannot watch it
        sys.stderr.write(f"scout: bootstrap not installed in pid {os.getpid()}: {exc!r}\n")


def _chain_site_sitecustomize():
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None or not spec.origin:
        return
    if os.path.abspath(spec.origin) == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_scout_install()
_chain_site_sitecustomize()
