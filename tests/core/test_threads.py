import threading

import torch

from modelward.core.threads import torch_thread_pool


def test_a_pool_s_threads_take_the_count_of_the_thread_that_built_it_not_the_last_one_set_elsewhere():
    main = torch.get_num_threads()
    other = 1 if main > 1 else 2
    side = threading.Thread(target=torch.set_num_threads, args=(other,))
    side.start()
    side.join()
    try:
        plain = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        seen: list[int] = []
        plain.start()
        plain.join()
        assert seen == [other]  # the hazard: a new thread takes the count set last, from anywhere
        ran: list[str] = []
        pool = torch_thread_pool(2, "t", initializer=lambda: ran.append("init"))
        got = [pool.submit(torch.get_num_threads).result() for _ in range(4)]
        pool.shutdown()
        assert set(got) == {main} and ran  # the builder's count; the initializer still runs
    finally:
        torch.set_num_threads(main)
