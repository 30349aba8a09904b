"""The localiser (pure: evidence in, verdict out) and the watchdogs' shared stall rule."""
