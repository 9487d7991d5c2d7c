"""The domain behind the HTTP surface, one sub-package per concept:

- `store/`: the job store (tables, engines, migrations) and a job's history in it;
- `accounts/`: API keys and tenants, quotas, rate limits, idempotent creates;
- `files/`: uploaded datasets, their full validation report, and jobs' result files;
- `requests/`: a job request from the body posted to a job ready to run (resolve -> check ->
  plan -> prepare), and the files, models and hub ids it names;
- `jobs/`: the job manager every route calls (`jobs/manager.py:JobService`), the lifecycle,
  the wire form, progress, and OpenAI's fine-tuning shapes;
- `scheduling/`: the scheduler, its pure policy, pools of capacity, the queue and estimates;
- `runs/`: a job attempt as a Ray Job: launcher, entrypoint, reporter, driver logs;
- `serving/`: the model servers' engine, model ids, exports and downloads;
- `webhooks/`: what a tenant is told, and the sender that tells it.

Shared by all: `settings.py` (the one settings object), `errors.py` (domain errors; one handler
in api/app.py maps them to HTTP), `credentials.py` (the operator's secrets, kept out of Ray),
`isolation.py` (work on a tenant's input in a bounded helper process), `metrics.py`, `jsonlog.py`.
"""
