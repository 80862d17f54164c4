"""Why a lease ended, in the words the usage ledger keeps.

Every way a server ends writes one of these into the ledger's ``reason``
column, so an admin reading ``api/usage`` or the CLI can tell a student who
pressed Stop from a node that died or a pod someone deleted by hand. The
words are fixed here, once: backends, the reconciler and the workbench
service all name a reason through these constants, never by writing the
text again. Reasons the workbench service announces for the stops it makes
carry their own detail after a colon ("reclaimed: GPU idle 30 min",
"reservation: ..."); ``reason_kind`` groups them by what comes before it.
"""

from __future__ import annotations

# Someone asked for the stop; the ``stopped by ...`` forms say who, where the hub knows.
STOPPED = "stopped"
STOPPED_BY_USER = "stopped by the user"
STOPPED_BY_ADMIN = "stopped by an admin"
STOPPED_BY_CULLER = "stopped by the idle culler"
STOPPED_BY_SERVICE = "stopped by a service"
# A course's instructor or TA stopped a student's server (the service's course API: "...: ann (ML-101)").
STOPPED_BY_INSTRUCTOR = "stopped by an instructor"
# The course whose quota a server ran under ended ("course ended: ml-101").
COURSE_ENDED = "course ended"
# The server's own process ended (it crashed, or the user shut it down from JupyterLab).
SERVER_EXITED = "server exited"
# A start that failed, timed out or was cancelled while waiting: the lease never served a running server.
START_FAILED = "start failed"
START_CANCELLED = "start cancelled"
# The engine ended it.
NODE_FAILED = "node failed"
JOB_CANCELLED = "job cancelled outside the hub"
JOB_TIMED_OUT = "job time limit reached"
POD_DELETED = "pod deleted outside the hub"
EVICTED = "evicted"
OUT_OF_MEMORY = "out of memory"
# The hub ended it.
LAYOUT_CHANGED = "MIG layout changed"
SERVER_GONE = "server gone"
REPLACED = "replaced by a new start"

ALL = (
    STOPPED,
    STOPPED_BY_USER,
    STOPPED_BY_ADMIN,
    STOPPED_BY_CULLER,
    STOPPED_BY_SERVICE,
    STOPPED_BY_INSTRUCTOR,
    COURSE_ENDED,
    SERVER_EXITED,
    START_FAILED,
    START_CANCELLED,
    NODE_FAILED,
    JOB_CANCELLED,
    JOB_TIMED_OUT,
    POD_DELETED,
    EVICTED,
    OUT_OF_MEMORY,
    LAYOUT_CHANGED,
    SERVER_GONE,
    REPLACED,
)


def reason_kind(reason: str) -> str:
    """The group a ledger reason belongs to in usage reports: ``"reclaimed: GPU idle 30 min"`` is
    ``"reclaimed"``, ``"stopped by an admin"`` stays itself; an empty reason (rows written before reasons
    were kept) is ``"unknown"``."""
    reason = (reason or "").strip()
    if not reason:
        return "unknown"
    if reason in ALL:
        return reason
    head, sep, _ = reason.partition(":")
    return head.strip() if sep else reason
