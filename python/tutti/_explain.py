"""``tutti.explain(dir)``: the report of a run's flight-recorder traces, as a dict.

Run the job with ``TUTTI_TRACE_DIR=DIR`` set: every rank times its ops and writes
``DIR/tutti-trace-rank<R>.json`` when its communicator is destroyed. Then::

    report = tutti.explain("DIR")
    report["stragglers"]["straggler"]      # the rank that arrives last, or None
    report["groups"][0]["busbw_gbps"]      # per collective and size class
    report["what_ifs"]                     # what would save time, largest first

The keys are those of ``tutti explain DIR --json FILE`` (docs/sim.md, "tutti explain").
"""

import json
import os
from typing import Any, Dict, Union

from . import _native

__all__ = ["explain"]


def explain(dir: Union[str, "os.PathLike[str]"]) -> Dict[str, Any]:
    """Reads every rank's trace in ``dir`` and returns the report as a dict.

    Raises ``ValueError`` naming the file when a trace is missing, truncated or was
    written without timings.
    """
    return json.loads(_native._explain(os.fspath(dir)))
