"""Finding a rendezvous when the launcher already owns MASTER_PORT (torchrun)."""

from __future__ import annotations

import datetime
import os
import socket
from typing import Any, List, Optional

from . import _native


def _route_to(host: str) -> Optional[str]:
    """This host's address on the route to `host`, or None if there is none."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))  # UDP: picks a route, sends nothing
            return s.getsockname()[0]
    except OSError:
        return None


def my_address() -> Optional[str]:
    """This host's address on the route to MASTER_ADDR (so that ranks on other hosts can
    reach a rank 0 that runs here), or None to let tutti choose (loopback, or
    ``TUTTI_SOCKET_IFNAME``'s address)."""
    if os.environ.get("TUTTI_SOCKET_IFNAME"):
        return None
    master = os.environ.get("MASTER_ADDR")
    if not master:
        return None
    return _route_to(master)


def local_addresses() -> List[str]:
    """This host's IPv4 addresses other than loopback (the core's interface list)."""
    return list(_native._local_addresses())


def _tcp_store_host(store: Any) -> Optional[str]:
    """The master's host of a torch TCPStore, looking through PrefixStores; None for
    other stores (a FileStore, a HashStore)."""
    from torch.distributed import PrefixStore, TCPStore

    for _ in range(16):
        if isinstance(store, TCPStore):
            return store.host
        if not isinstance(store, PrefixStore):
            return None
        store = store.underlying_store
    return None


_ADDRS_KEY = "tutti/addresses/"


def address_for_group(store: Any, rank: int, size: int) -> Optional[str]:
    """The address rank 0 of a torch process group should listen on (every rank calls
    this, before rank 0 publishes its UniqueId in `store`; only rank 0's result is used):
    None, for tutti's default (loopback, or ``TUTTI_SOCKET_IFNAME``'s address), when the
    group's ranks all run on this host.

    Where the master is known, the address on the route to it: ``MASTER_ADDR`` (env://,
    torchrun), or the host of a TCPStore (``init_method="tcp://HOST:PORT"``). Otherwise
    (``file://``) every other rank publishes its addresses in the store, and if any
    rank's differ from rank 0's, rank 0 takes its own address on the route to the first
    such rank's, so that ranks on other hosts can reach it (a rank on another host would
    otherwise be told 127.0.0.1, and wait for its timeout)."""
    if os.environ.get("TUTTI_SOCKET_IFNAME"):
        return None
    if os.environ.get("MASTER_ADDR"):
        return my_address()
    host = _tcp_store_host(store)
    if host is not None:
        return _route_to(host) if rank == 0 else None
    if size < 2:
        return None
    if rank != 0:
        store.set(f"{_ADDRS_KEY}{rank}", " ".join(local_addresses()))
        return None
    mine = set(local_addresses())
    for r in range(1, size):
        theirs = store.get(f"{_ADDRS_KEY}{r}").decode().split()
        if set(theirs) != mine:
            for a in theirs:
                route = _route_to(a)
                if route is not None and not route.startswith("127."):
                    return route
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
