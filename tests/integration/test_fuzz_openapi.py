"""Property-based fuzzing of the whole OpenAPI surface (schemathesis), in process against the
ASGI app over a real SQLite store (no Ray): no 5xx, every status documented, every response
body matching its schema. A bounded number of examples per operation keeps it short."""

import tempfile
from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from eft.service.accounts.auth import KeyStore
from eft.service.settings import Settings
from eft.service.store.store import Store
from tests.helpers.app import service_app

MAX_EXAMPLES = 12

# Built at import so schemathesis can read the schema while collecting; its own EFT home.
_settings = Settings(home=Path(tempfile.mkdtemp(prefix="eft-fuzz-")))
_store = Store(_settings.resolved_database_url)
_, _KEY = KeyStore(_store.engine).create("fuzz")
app = service_app(_store, _settings)
schema = schemathesis.openapi.from_dict(app.openapi())
schema.app = app  # requests go to the ASGI app in process, as from_asgi sets up


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors_and_responses_match_their_schema(case):
    case.call_and_validate(
        headers={**(case.headers or {}), "Authorization": f"Bearer {_KEY}"},
        checks=[not_a_server_error, status_code_conformance, content_type_conformance,
                response_schema_conformance],
    )
