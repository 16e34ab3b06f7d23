"""A worker for test_torchrun.py's elastic restart: attempt 0's rank 1 dies after the
communicator is up; torchrun (--max-restarts 1) restarts every worker, and attempt 1's
ranks must form a new communicator through the agent's store and reduce correctly."""
import os
import sys

import numpy as np

import tutti

attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
comm = tutti.Communicator.from_env(timeout=30.0)
r, n = comm.rank(), comm.size()
x = np.full(1024, r + 1 + 10 * attempt, np.float32)
comm.all_reduce(x)
assert np.all(x == n * (n + 1) / 2 + 10 * attempt * n), x[:4]
if attempt == 0 and r == 1:
    print(f"attempt {attempt}: rank {r} dies", flush=True)
    os._exit(3)
if attempt == 0:
    # Waits on the dead rank until the agent stops this worker.
    comm.barrier()
    comm.barrier()
    print(f"attempt {attempt}: rank {r} should not get here", flush=True)
    sys.exit(4)
comm.barrier()
print(f"attempt {attempt}: rank {r}/{n} OK", flush=True)
