"""Which jobs run, where and when: the scheduler's passes (`scheduler.py`), the pure cluster
policy (`policy.py`), pools of capacity read from Ray (`capacity.py`), the dispatch order and
queue positions (`queueing.py`), and what a job costs (`estimates.py`)."""
