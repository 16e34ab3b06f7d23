"""Type stubs for ``tutti._native``, the compiled half of the package (crates/tutti-py).

The public API is in ``tutti`` (numpy) and ``tutti.torch``; this module is what they call.
"""

from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

__version__: str

class UniqueId:
    """The rendezvous handle: rank 0's address and port and an auth token.
    ``str(uid)`` is ``"tutti1:ADDR:PORT:TOKEN"``; ``UniqueId(s)`` parses it."""

    def __init__(self, s: str) -> None: ...
    @staticmethod
    def new(host: Optional[str] = None) -> "UniqueId":
        """A fresh id with a random token. Without ``host`` rank 0 listens on loopback (or
        ``TUTTI_SOCKET_IFNAME``'s address) and must run in this process; with ``host`` a
        free port is picked and rank 0 binds it on all interfaces when it joins."""
    @staticmethod
    def for_address(host: str, port: int) -> "UniqueId":
        """The id every rank can compute from the master's address (``tcp://HOST:PORT``):
        the token is ``TUTTI_TOKEN`` or derived from host and port."""
    @property
    def address(self) -> str:
        """Rank 0's ``"ADDR:PORT"``."""
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

class Work:
    """The handle of an asynchronous op."""

    def wait(self, timeout: Optional[float] = None) -> bool:
        """True once done; raises the op's error, or the built-in ``TimeoutError`` if it is
        still running after ``timeout`` seconds. Releases the GIL while waiting."""
    def is_completed(self) -> bool: ...
    def is_success(self) -> bool: ...
    def exception(self) -> Optional[BaseException]: ...
    def status(self) -> Optional[Tuple[int, int, int]]:
        """For a receive (of ``Communicator._p2p``) that completed successfully,
        ``(source, tag, nbytes)``; None for other ops, and before."""

class Communicator:
    """A tutti communicator. ``_call`` runs any collective on raw addresses, ``_p2p``
    sends and receives."""

    @staticmethod
    def init_rank(unique_id: Union[UniqueId, str], nranks: int, rank: int,
                  timeout: Optional[float] = None) -> "Communicator": ...
    @staticmethod
    def from_env(timeout: Optional[float] = None) -> "Communicator": ...
    @staticmethod
    def init_all(n: int, timeout: Optional[float] = None) -> List["Communicator"]: ...
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def local_rank(self) -> int: ...
    @property
    def local_size(self) -> int: ...
    @property
    def timeout(self) -> Optional[float]: ...
    @timeout.setter
    def timeout(self, secs: Optional[float]) -> None: ...
    @property
    def destroyed(self) -> bool: ...
    def topology(self) -> str: ...
    def split(self, color: Optional[int], key: int) -> Optional["Communicator"]: ...
    def new_group(self, ranks: Sequence[int]) -> Optional["Communicator"]: ...
    def shrink(self, dead: Sequence[int]) -> "Communicator": ...
    def abort(self) -> None: ...
    def destroy(self) -> None: ...
    def ops_done(self) -> int: ...
    def _call(
        self,
        kind: int,
        arg: int,
        dtype: int,
        op: int,
        count: int,
        send: int,
        send_len: int,
        recv: int,
        recv_len: int,
        timeout: Optional[float] = None,
        async_op: bool = False,
        keep: Any = None,
        callback: Optional[Callable[[Optional[BaseException]], None]] = None,
        vcounts: Optional[Tuple[List[int], List[int], List[int], List[int]]] = None,
        wire: Optional[str] = None,
    ) -> Optional[Work]:
        """Runs collective ``kind`` (codes in ``tutti._codes``) on raw memory. The caller
        guarantees the addresses stay valid and untouched until the call returns (blocking)
        or the op completes (``async_op``: ``keep`` is held until then, then
        ``callback(None or exception)`` runs on the completer thread). ``wire``: ``"bf16"``
        or ``"f16"`` puts an f32 SUM/AVG reduction on the 16-bit wire."""

    def _p2p(
        self,
        ops: Sequence[Tuple[bool, int, int, int, int, bool]],
        timeout: Optional[float] = None,
        async_op: bool = False,
        keep: Any = None,
        callback: Union[None, Callable[[Optional[BaseException]], None],
                        Sequence[Optional[Callable[[Optional[BaseException]], None]]]] = None,
    ) -> List[Any]:
        """Posts sends and receives at once on the point-to-point channel. ``ops``:
        ``(is_send, peer, address, nbytes, tag, exact)``; a receive's peer -1 is any source;
        ``exact``: the message must fill the receive buffer (else at most). Blocking: waits
        (without the GIL) for all and returns per op ``(source, tag, nbytes)`` for a receive
        or None for a send, raising the first error once all ended. ``async_op``: returns
        a ``Work`` per op; ``keep`` is held until each op is done, then its callback (one
        callable for all ops, or one per op) runs on a completer thread. Ops complete in
        any order. The caller guarantees the addresses as for ``_call``."""

def buffer(array: Any, writable: bool, what: str = "array") -> Tuple[int, int, int, int]:
    """``(address, nbytes, dtype code, itemsize)`` of a C-contiguous numpy array; raises
    TypeError / ValueError for anything tutti cannot use in place."""

def _dtype_codes() -> List[Tuple[str, int, int]]: ...
def _local_addresses() -> List[str]: ...

# ---- training (crates/tutti-py/src/training.rs) ----

class TopK:
    """Top-K sparsification with error feedback (``tutti::TopK``); see ``tutti.TopK``."""

    def __init__(self, len: int, ratio: float, error_feedback: bool = True) -> None: ...
    @property
    def k(self) -> int: ...
    @property
    def len(self) -> int: ...
    @property
    def error_feedback(self) -> bool: ...
    def residual(self) -> Any:
        """A copy of the residual (float32 numpy array)."""
    def compress(self, grad: Any) -> Tuple[Any, Any]:
        """``(indices uint32, values float32)`` of the ``k`` largest entries of grad + residual."""

def _all_reduce_many(comm: Communicator, bufs: Sequence[Tuple[int, int]], dtype: int, op: int, bucket_bytes: int,
                     wire: Optional[str] = None, timeout: Optional[float] = None) -> None:
    """``all_reduce_many`` over ``(address, nbytes)`` buffers of one dtype, in place, blocking."""
def _sparse_all_reduce(comm: Communicator, indices: Any, values: Any, out: int, out_count: int, op: int) -> str:
    """Dense sum of every rank's (uint32 indices, float32 values) into ``out_count`` floats
    at address ``out``; returns the route (``"gather"`` or ``"dense"``)."""
def _sparse_route(comm: Communicator, k_max: int, len: int) -> str:
    """The route the cost model picks for ``k_max`` pairs per rank and ``len`` elements."""
def _top_k_all_reduce(comm: Communicator, grad: int, count: int, topk: TopK, op: int) -> str:
    """Top-K AllReduce of ``count`` floats at address ``grad``, in place; returns the route."""
def _explain(dir: str) -> str: ...
def _predict_us(comm: Communicator, collective: str, count: int, dtype: str, root: int = 0) -> Tuple[str, float]: ...
