"""A job attempt as a Ray Job: started and asked about by the launcher (`launcher.py`), run by
the entrypoint (`entrypoint.py`), writing to the store through the reporter (`reporter.py`),
its driver's output read back as logs (`logs.py`)."""
