"""`scout acceptance`: the witnessed test a buyer runs. `steps` judges (pure), `run` submits the
jobs and gathers what they left (the rim), `load` is the background-load generator."""
