"""Worker threads that compute with the torch thread count of the thread that made them.

``torch.set_num_threads`` is not one process-wide number under OpenMP: it sets the calling thread's count and the
count that threads *starting later* take, while every thread started before keeps its own. A call made from a side
thread (a library, a server thread, an earlier test) therefore leaves the main thread with one count and new
threads with another, and the same operation then rounds differently on the two (measured: a two-party split run
whose passes ran on the driver's thread and on the party's update threads left other state digests than the same
run on one thread count). Split training promises bit-identical results across its modes, so the executors of a
party and of the driver take their count from the thread that built them, not from whatever was set last.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch


def torch_thread_pool(max_workers: int, thread_name_prefix: str,
                      initializer: Callable[[], object] | None = None) -> ThreadPoolExecutor:
    """A ThreadPoolExecutor whose threads use the torch intra-op thread count of the calling thread.

    Args:
        max_workers: the number of worker threads.
        thread_name_prefix: their name prefix.
        initializer: run in each new worker after its thread count is set (e.g. a priority change).

    Returns:
        The executor.

    Example:
        >>> pool = torch_thread_pool(1, "demo")
        >>> pool.submit(torch.get_num_threads).result() == torch.get_num_threads()
        True
        >>> pool.shutdown()
    """
    count = torch.get_num_threads()

    def start() -> None:
        torch.set_num_threads(count)
        if initializer is not None:
            initializer()

    return ThreadPoolExecutor(max_workers, thread_name_prefix=thread_name_prefix, initializer=start)
