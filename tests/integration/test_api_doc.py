"""docs/api.md lists exactly the operations of the OpenAPI document."""

import re

from tests.helpers.paths import REPO

DOC = REPO / "docs" / "api.md"


def test_api_doc_lists_every_operation_and_no_other(client):
    spec = client.app.openapi()
    operations = {f"{method.upper()} {path}" for path, item in spec["paths"].items() for method in item}
    documented = set(re.findall(r"^\| `((?:GET|POST|DELETE|PUT|PATCH) [^`]+)` \|", DOC.read_text(), re.M))
    assert documented == operations


def test_every_operation_documents_the_error_envelope(client):
    spec = client.app.openapi()
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if path in ("/healthz", "/metrics"):  # open to probes and Prometheus, take no input
                continue
            assert {"401", "404", "422"} <= set(op["responses"]), f"{method} {path}"
            schema = op["responses"]["422"]["content"]["application/json"]["schema"]
            assert schema["$ref"].endswith("/ErrorResponse"), f"{method} {path}"
