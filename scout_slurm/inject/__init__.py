"""Fault injection, configured from outside (SCOUT_INJECT), for unmodified training scripts."""
