"""A job request's way from the body posted to a job ready to run, in four named stages:

1. `resolve.py`: the model and dataset names it gives, to directories and files (scanned whole);
2. `check.py`: every check that needs no tokenization, with the chat templates' (`templates.py`),
   all problems in one 422;
3. `plan.py`: the configuration it runs with, the planner's where the request leaves it open;
4. `prepare.py`: in the scheduler, its data tokenized and its training config built.

Stages 1-3 run on the request path (`service/jobs/manager.py:JobService.create`), stage 4 in the
scheduler's validation, in the replica's helper process. Nothing here knows of jobs' lifecycle or
scheduling: this package imports no `service/jobs/manager.py` or `service/scheduling/scheduler.py`.
"""
