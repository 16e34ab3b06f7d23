"""Waiting for an idle machine before a timed run (as shared/peers' QUIET_WAIT does)."""
import time


def _idle():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[3] + v[4], sum(v)


def wait_quiet(max_wait: float, idle_frac: float = 0.85, window: float = 5.0) -> bool:
    """Waits up to `max_wait` seconds for a `window`-second stretch with at least `idle_frac`
    of the CPU time idle. Returns True if it found one."""
    end = time.monotonic() + max_wait
    while True:
        i0, t0 = _idle()
        time.sleep(window)
        i1, t1 = _idle()
        frac = (i1 - i0) / max(t1 - t0, 1)
        if frac >= idle_frac:
            return True
        if time.monotonic() >= end:
            print(f"# warning: the machine was busy (idle {frac:.0%} in the last {window:.0f} s); numbers may be low",
                  flush=True)
            return False
