"""The task shim (`scout-task`): torch environment, rank place, progress record, watchdog."""
