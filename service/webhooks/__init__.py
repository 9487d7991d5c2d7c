"""Webhooks: which changes a tenant is told of, where, and signed how (`rules.py`); the sender
each replica runs to deliver them (`sender.py`)."""
