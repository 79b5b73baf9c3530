"""Exit codes of ``python -m coordinator sweep`` and ``daemon start``: one table, relied on by
launchers and scripts (README, "Exit codes").

=====  ===================  =====================================================================
code   name                 meaning
=====  ===================  =====================================================================
0      OK                   sweep: every planned trial has a result (a measurement failure is a
                            result); daemon: stopped when asked (SHUTDOWN from the coordinator)
1      ERROR                an error servetune did not expect, or the sweep failed (store, the
                            local daemon died); the message says which
2      USAGE                bad input: an invalid spec, flag or fleet file, an unknown experiment,
                            a fleet sweep without coordinator keys; ``keys`` commands: a malformed
                            key or name, a missing or malformed key file
3      HOLES                the sweep ended with trials not measured (sweep budget spent, a trial's
                            retry budget of transport failures used up, a hardware class drained
                            after two breaker cool-downs with no daemon of it in service); run it
                            again to fill them
4      NO_DAEMON            no daemon was connected for ``--daemon-wait`` seconds; holes are left
5      DAEMON_CONFIG        daemon: this node's configuration is unusable (vLLM interpreter missing,
                            work folder not writable, bad CPU list, no daemon keys or coordinator key)
6      LOST_COORDINATOR     daemon: no word from the coordinator for ``--coordinator-lost`` seconds
130    INTERRUPTED          stopped by SIGINT or SIGTERM; finished results are kept
=====  ===================  =====================================================================
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    ERROR = 1
    USAGE = 2
    HOLES = 3
    NO_DAEMON = 4
    DAEMON_CONFIG = 5
    LOST_COORDINATOR = 6
    INTERRUPTED = 130
