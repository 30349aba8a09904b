"""What a site installs from the wheel alone: the example site config, the slurm.conf snippet, the
threat model (package data here), and the layout `scout site install` writes from them
(`layout.py`)."""
