"""`eft`: the command line of the elastic fine-tuning service (the application: `eft.cli.main`).

The commands live one module per resource (`jobs.py`, `files.py`, `models.py`, `plan.py`,
`watch.py`); what they share (the client, options, tables, JSON and errors) is `eft.cli.output`,
the one module commands and plugins import. Importing this package loads nothing else, so a
plugin (the server's `eft.api.cli`) may import `eft.cli.output` without loading the application
that loads it.
"""
