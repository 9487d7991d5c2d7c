"""Uploaded files: where they are stored and who owns them (`store.py`), a dataset's full
validation report (`report.py`), and a succeeded job's result file (`results.py`)."""
