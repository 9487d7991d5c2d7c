"""`/ui`: the service's web page: job list, job page with live loss curves, submit form.

Pages are server-rendered shells that hold no job data, so they need no credentials; the
browser fills them from the REST API with `static/ui.js`, which sends the API key the user
entered (kept in the browser's localStorage) as `Authorization: Bearer <key>`. Charts use uPlot,
vendored under static/vendor (no network needed at run time).
"""

from __future__ import annotations

import html
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

from eft.api.deps import JobServiceDep

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
router = APIRouter(prefix="/ui", tags=["ui"], include_in_schema=False)

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} - eft</title>
<link rel="stylesheet" href="/ui/static/vendor/uplot/uPlot.min.css">
<link rel="stylesheet" href="/ui/static/ui.css">
</head><body data-page="{page}" data-job-id="{job_id}">
<header><a class="brand" href="/ui">eft</a> <span>elastic fine-tuning on Ray</span>
<nav><a href="/ui">Jobs</a> <a href="/ui/new">Submit</a> <span id="admin-links"></span>
<label>API key <input id="api-key" type="password" autocomplete="off" placeholder="none"></label></nav></header>
<main>{body}</main>
<script src="/ui/static/vendor/uplot/uPlot.iife.min.js"></script>
<script src="/ui/static/ui.js"></script>
</body></html>
"""

_LIST = """<h1>Jobs</h1><p id="error" class="error" hidden></p>
<table id="jobs"><thead><tr><th>Job</th><th>Name</th><th>Status</th><th>Progress</th><th>ETA</th>
<th>Model</th><th>Workers</th><th>Created</th></tr></thead><tbody></tbody></table>"""

_JOB = """<h1 id="title">{job_id}</h1><p id="error" class="error" hidden></p>
<p id="actions"><button type="button" id="pause" hidden>Pause</button>
<button type="button" id="resume" hidden>Resume</button>
<button type="button" id="cancel" hidden>Cancel</button></p>
<section class="summary"><dl id="summary"></dl></section>
<section class="charts">
<figure><figcaption>Loss and eval loss by step</figcaption><div id="loss-chart" class="chart"></div></figure>
<figure><figcaption>Learning rate and tokens/s by step</figcaption><div id="rate-chart" class="chart"></div></figure>
<figure id="rewards-figure" hidden><figcaption>Preference tuning: reward margin and accuracy by step</figcaption><div id="rewards-chart" class="chart"></div></figure>
</section>
<section><h2>Events</h2><table id="events"><thead><tr><th>Time</th><th>Attempt</th><th>Type</th>
<th>Message</th></tr></thead><tbody></tbody></table></section>
<section id="chat" hidden><h2>Chat</h2>
<form id="chat-form"><label>Model <select name="model" id="chat-model"></select></label>
<label class="wide">Message <textarea name="message" rows="2" required></textarea></label>
<label>Max tokens <input name="max_tokens" type="number" min="1" value="64"></label>
<button type="submit">Send to both</button></form>
<div class="chat-columns"><div><h3 id="chat-base-title">Base model</h3><pre id="chat-base"></pre></div>
<div><h3 id="chat-tuned-title">Fine-tuned</h3><pre id="chat-tuned"></pre></div></div></section>
<section><h2>Replies to validation prompts</h2><table id="eval-samples"><thead><tr><th>Step</th><th>Eval loss</th>
<th>Prompt</th><th>Reference</th><th>Reply</th></tr></thead><tbody></tbody></table></section>
<section><h2>Checkpoints</h2><table id="checkpoints"><thead><tr><th>Step</th><th>Reason</th><th>Eval loss</th>
<th>Best</th><th>Workers</th><th>Size</th><th>Save s</th><th>Model id</th></tr></thead><tbody></tbody></table></section>
<section><h2>Manifest</h2><pre id="manifest">(written when the job succeeds)</pre></section>"""

_NEW = """<h1>Submit a job</h1><p id="error" class="error" hidden></p>
<form id="submit-form">
<label>Model <input name="model" required value="tiny-llama"></label>
<label>Training file <input name="training_file" required placeholder="data/train.jsonl"></label>
<label>Validation file <input name="validation_file"></label>
<label>Name <input name="name"></label>
<label>Method <select name="method"><option>lora</option><option>qlora</option><option>full</option></select></label>
<label>Max steps <input name="max_steps" type="number" min="1"></label>
<label>Epochs <input name="epochs" type="number" min="0" step="any"></label>
<label>Learning rate <input name="learning_rate" type="number" min="0" step="any"></label>
<label>Strategy <select name="strategy"><option>auto</option><option>ddp</option><option>fsdp</option>
<option>zero1</option><option>zero2</option><option>zero3</option></select></label>
<label>Min workers <input name="min_workers" type="number" min="1"></label>
<label>Max workers <input name="max_workers" type="number" min="1"></label>
<button type="submit">Submit</button></form>"""


#: The pages load only this origin's scripts, styles and data, run no inline script, and are
#: never framed (no clickjacking of the job actions); nothing is sniffed into another type.
PAGE_HEADERS = {
    "Content-Security-Policy": ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
                                "frame-ancestors 'none'"),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class _StaticFiles(StaticFiles):
    """The page's scripts and styles, served as their declared type only."""

    def file_response(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201 - StaticFiles' own signature
        response = super().file_response(*args, **kwargs)
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response


def _render(service: JobServiceDep, page: str, title: str, body: str, job_id: str = "") -> HTMLResponse:
    # No link to Ray's dashboard in the page itself: the script asks GET /me, which names the
    # dashboard to admins only (its Jobs API runs arbitrary code; it is not for tenants).
    return HTMLResponse(_PAGE.format(title=html.escape(title), page=page, job_id=html.escape(job_id, quote=True),
                                     body=body), headers=PAGE_HEADERS)


@router.get("", response_class=HTMLResponse)
def job_list_page(service: JobServiceDep) -> HTMLResponse:
    """The job list: status, progress and ETA, refreshed live."""
    return _render(service, "list", "Jobs", _LIST)


@router.get("/new", response_class=HTMLResponse)
def submit_page(service: JobServiceDep) -> HTMLResponse:
    """A form that creates a job through POST /jobs."""
    return _render(service, "new", "Submit a job", _NEW)


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(job_id: str, service: JobServiceDep) -> HTMLResponse:
    """One job: live loss charts, rates, events, checkpoints, manifest, Ray dashboard link."""
    safe = html.escape(job_id)
    return _render(service, "job", job_id, _JOB.format(job_id=safe), job_id)


def install(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/ui/static", _StaticFiles(directory=STATIC_DIR), name="ui-static")

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/ui")
