"""Rank process of cost_model_test.py: joins a communicator across two daemons, runs AllReduces
of the sizes in $SIZES (float32 elements, comma separated), checks the sums, then holds the
communicator open until the file $GO exists (bounded), so that the test can ask the daemons
(railctl explain) about the live communicator."""

import os
import sys
import time

import numpy as np

import railyard


def main() -> int:
    comm = railyard.init_from_env(timeout=60)
    n = comm.nranks
    for count in (int(c) for c in os.environ["SIZES"].split(",")):
        x = comm.client.empty(count, np.float32)
        x[:] = comm.rank + 1
        comm.all_reduce(x)
        assert np.all(x == n * (n + 1) / 2), (count, x[:4])
    comm.barrier()
    open(os.path.join(os.environ["READY_DIR"], f"ready.{comm.rank}"), "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(os.environ["GO"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    comm.barrier()
    comm.close()
    comm.client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
