"""What runs inside the training process, without edits to the script: the `site/` folder goes
on PYTHONPATH, its sitecustomize installs `hooks` and then runs any sitecustomize it shadows.
Modules here import only the standard library and torch, so they work in the user's Python."""
