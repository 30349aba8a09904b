"""When a watchdog confirms, decides and wakes up while its ranks stop advancing (pure).

A stall is called when a rank made no progress for longer than its threshold (the floor, or
`stall_factor` step times). Before it calls one, a watchdog watches its peers' publications for a
confirmation window: long enough to tell a silent peer (its watchdog or node gone) from one that
is merely slow to write, and to see whether a peer still advances (then it is not a job-wide
stall). What the watchdog then decides is unchanged; this module only says *when*:

- the window starts while the rank is already idle, `confirm_s` before its threshold (never
  before half the threshold, when peers start publishing fast: task/publishing.py), so it has run
  its course when the threshold passes and the call comes at the threshold, not threshold +
  window. A rank that advances again before its threshold ends the window and nothing is called,
  exactly as before; a rank idle past its threshold is now called at the threshold, where before
  it had the window on top (the threshold is what the site configured: "never call a stall sooner
  than this").
- a stall is called only once a rank is past its threshold AND the window has lasted `confirm_s`
  (a threshold shorter than twice the window: the window's end decides, e.g. 4 s and 2 s: from 2 s
  idle to 4 s).
- the watchdog sleeps its poll interval while everything advances; while confirming it wakes at
  the next moment something becomes due (a threshold, the window's end), so the call is not late
  by up to a poll interval. It never sleeps longer than the poll interval (a peer's decision, a
  rank that advances again), nor shorter than `min_sleep_s`.

It also owns the start-up rule (below): the start-up limit (`startup_grace_s`) means something
only where a peer waits. A rank that has not entered init_process_group is on no clock until
some rank of its job step has entered it (the bootstrap marks the record before torch's
rendezvous; the first watchdog to see a mark says so in the evidence folder): a program that
never starts torch.distributed (data preparation, an evaluation script) is watched for its exit
only, and a job whose every rank loads for minutes before init is starting, not hung. Once a peer
waits at the rendezvous, the start-up clock of a rank not there runs from that moment; past the
limit it is a `startup hang`, and it is behind every rank that entered (localise/stall.py).
The same holds after init for the job's first collective (a rank loading a checkpoint between
init and DDP's first broadcast while its peers wait there; no clock while every rank still loads).
Ranks past their first collective keep the rules below unchanged.
"""

from __future__ import annotations

MIN_SLEEP_S = 0.01


def confirm_from_s(threshold_s: float, confirm_s: float) -> float:
    """Idle seconds after which a rank's watchdog starts its confirmation window."""
    return max(threshold_s - confirm_s, threshold_s / 2)


def confirming(idle_s: float, threshold_s: float, confirm_s: float) -> bool:
    """Has this rank been idle long enough to watch its peers (the window is open)?"""
    return idle_s > confirm_from_s(threshold_s, confirm_s)


def stalled(idle_s: float, threshold_s: float) -> bool:
    """Is this rank past its stall threshold (the same rule as before the window moved)?"""
    return idle_s > threshold_s


def may_decide(*, now: float, window_since: float, confirm_s: float, any_stalled: bool) -> bool:
    """A stall is called only when a rank is past its threshold and the window has run its
    course.
    """
    return any_stalled and now - window_since >= confirm_s


def next_sleep_s(
    *, now: float, poll_s: float, due: list[float], min_sleep_s: float = MIN_SLEEP_S
) -> float:
    """How long to sleep: the poll interval, or less when something becomes due sooner (`due`:
    monotonic moments: a rank's threshold, the window's end)."""
    upcoming = [t - now for t in due if t > now]
    wait = min([poll_s, *upcoming])
    return max(min_sleep_s, min(poll_s, wait))


# ---- start-up and busy phases ------------------------------------------------------------------
# The stall clock (the floor, `stall_factor` step times) arms only once training advances: at the
# first optimizer step, or once `arm_after_collectives` collectives completed (a job whose optimizer
# scout cannot see). Before that a rank is starting (imports, `deepspeed.initialize`, compiling,
# loading a checkpoint after a resume) and gets the separate start-up limit; a stall then is a
# `startup hang`. A rank inside a checkpoint save or load (the bootstrap marks torch.save/torch.load
# busy in its progress record) is busy, not hung: it too gets the start-up limit. Before
# init_process_group, and after it before the job's first collective, the start-up clock runs only
# while a peer waits at that point (idle_from).

PHASE_STARTUP = "startup"
PHASE_TRAINING = "training"
PHASE_CHECKPOINT = "checkpoint I/O"


def idle_from(
    *,
    last_change: float,
    entered_init: bool,
    peer_at_init_since: float | None,
    now: float,
    entered_collective: bool = True,
    peer_in_collective_since: float | None = None,
) -> float:
    """The moment from which a rank's idle time counts (idle = now - this).

    The start-up has two points every rank of a job step passes: init_process_group's rendezvous,
    then the job's first collective. A rank not yet at one of them is on no clock while no rank of
    its step has reached it (`peer_..._since` None: idle stays 0, so it is never watchful, never
    stalled, and reads to its peers as still starting: every rank loading a checkpoint for minutes,
    before or after init, is a slow start, not a hang); once one has, from when this watchdog learnt
    it (its own monotonic clock: wall clocks of other nodes are never compared), or its own later
    change. A rank past both: its last change, as always."""
    if not entered_init:
        return now if peer_at_init_since is None else max(last_change, peer_at_init_since)
    if not entered_collective:
        return (
            now if peer_in_collective_since is None else max(last_change, peer_in_collective_since)
        )
    return last_change


def armed(*, opt_steps: int, coll_completed: int, arm_after_collectives: int) -> bool:
    """Has training advanced far enough for the stall clock to run?"""
    return opt_steps > 0 or (arm_after_collectives > 0 and coll_completed >= arm_after_collectives)


def phase(*, armed_: bool, busy: bool) -> str:
    if not armed_:
        return PHASE_STARTUP
    return PHASE_CHECKPOINT if busy else PHASE_TRAINING


def threshold_s(
    *, phase_: str, floor_s: float, factor: float, typical_step_s: float, startup_limit_s: float
) -> float:
    """Idle seconds after which a rank in `phase_` is stalled."""
    training = max(floor_s, factor * typical_step_s)
    if phase_ == PHASE_STARTUP:
        return startup_limit_s
    if phase_ == PHASE_CHECKPOINT:
        return max(training, startup_limit_s)
    return training
