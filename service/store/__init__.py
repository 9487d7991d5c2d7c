"""The job store: the tables (`schema.py`), the database engines (`db.py`), the migrations
that build them (`migrations/`), and `Store` (`store.py`, with a job's history in `history.py`),
the single source of truth for jobs, their events, metrics and checkpoints."""
