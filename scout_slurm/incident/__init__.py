"""The incident pipeline: what the controller Epilog (or the batch host's node Epilog) does with a
run that failed or left a finding. One `Incident` value (incident.py) flows through the stages in
this order: gather -> localise -> decide -> plan -> apply -> report (run.py runs them). localise,
decide and plan are pure; gather, apply and report are the rim that reads and writes."""
