"""Finding a rendezvous when the launcher already owns MASTER_PORT (torchrun)."""

from __future__ import annotations

import datetime
import os
import socket
from typing import Optional

from . import _native


def my_address() -> Optional[str]:
    """This host's address on the route to MASTER_ADDR (so that ranks on other hosts can
    reach a rank 0 that runs here), or None to let tutti choose (loopback, or
    ``TUTTI_SOCKET_IFNAME``'s address)."""
    if os.environ.get("TUTTI_SOCKET_IFNAME"):
        return None
    master = os.environ.get("MASTER_ADDR")
    if not master:
        return None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master, 9))  # UDP: picks a route, sends nothing
            return s.getsockname()[0]
    except OSError:
        return None


def under_torchrun() -> bool:
    """True in a worker started by torchrun, whose agent serves a TCPStore on MASTER_PORT
    (so tutti's own store cannot listen there), unless TUTTI_* variables say otherwise."""
    return (os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
            and not os.environ.get("TUTTI_MASTER_PORT") and not os.environ.get("TUTTI_RANK"))


_uses = 0


def unique_id_via_torch_store(rank: int, timeout: float = 300.0) -> str:
    """Rank 0 makes a UniqueId and publishes it in torchrun's store; the others read it.
    Every rank must call this the same number of times (each call is a new id)."""
    global _uses
    from torch.distributed import TCPStore

    _uses += 1
    key = f"tutti/{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}/" \
          f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/unique_id/{_uses}"
    store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                     timeout=datetime.timedelta(seconds=timeout))
    if rank == 0:
        uid = str(_native.UniqueId.new(my_address()))
        store.set(key, uid)
        return uid
    return store.get(key).decode()
