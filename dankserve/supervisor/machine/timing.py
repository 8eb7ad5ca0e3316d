"""How long the machine waits for things: the timers its handlers set."""

from __future__ import annotations

HEALTH_RETRY_SECONDS = 0.05
"""How often /health is asked once this boot's log says the server is up, until it answers."""
MAX_IDLE_SECONDS = 1.0
"""The interpreter looks around (a Tick) at least this often while a workload runs."""
FREE_MEMORY_RETRY_SECONDS = 0.5
"""How often free GPU memory is read again while waiting for a dead server's memory to come back."""
PORT_RECHECK_SECONDS = 1.0
"""How often a port another process holds is looked at again: the boot starts within this of its release."""
EXIT_WAIT_SECONDS = 10.0
"""How long to wait for a workload to exit after its log ended or named a failure."""
UNANSWERED_HEALTH_SECONDS = 30.0
"""This boot's log said the server is up, but /health has not answered for this long: say so (once).
Seen on a real host: a dead container's port forward left in front of its replacement's."""
UNANSWERED_HEALTH_MESSAGE = (
    "the server's log says it is up, but /health on its port has not answered for {seconds:.0f} s: "
    "something between dankserve and the server drops the connection (a stale port forward of an earlier "
    "container: check `iptables -t nat -S CNI-HOSTPORT-DNAT` and that iptables is on the default PATH, "
    "`dankserve doctor`; or a firewall); waiting until the boot timeout"
)
WARM_UP_TIMEOUT_SECONDS = 60.0
"""The most the warm-up before READY may take (within the boot's own deadline): a first request compiles
vLLM's kernels in about a second; one that takes a minute finds an engine that does not serve."""
