"""schemathesis (fixed seed) over the live server's OpenAPI: no 5xx, every status and body documented."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from schemathesis import checks

from bench.live_server import LiveServer

#: Checks that cannot hold for this API, and why:
#: - positive_data_acceptance: a schema-valid body is refused when it breaks rules the schema
#:   cannot express (vector length = the served layout's D, subspace names, one weight source).
EXCLUDED = [checks.positive_data_acceptance]
EXAMPLES_PER_OPERATION = 200
MIN_CASES = 1000  # over the whole API (operations with few distinct inputs run out early)


@pytest.mark.slow
def test_openapi_conformance(served: LiveServer) -> None:
    """Every operation, fixed seed, every check but the one above, at least ``MIN_CASES``
    cases in all: no 5xx, documented statuses, bodies and content types.

    (``schemathesis.pytest.from_fixture`` does not run under pytest 9, so the operations'
    hypothesis strategies are driven directly.)
    """
    schema = schemathesis.openapi.from_url(f"{served.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 8
    cases = 0
    for operation in operations:

        @seed(20261130)
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
            phases=[Phase.explicit, Phase.generate],
        )
        @given(case=operation.as_strategy())
        def run(case: schemathesis.Case) -> None:
            nonlocal cases
            cases += 1
            case.call_and_validate(base_url=served.url, excluded_checks=EXCLUDED)

        run()
    print(f"schemathesis: {cases} cases over {len(operations)} operations")
    assert cases >= MIN_CASES


def test_schema_documents_the_error_responses(served: LiveServer) -> None:
    import httpx

    spec = httpx.get(f"{served.url}/openapi.json").json()
    search = spec["paths"]["/v1/search"]["post"]["responses"]
    for status in ("413", "422", "429", "503"):
        ref = search[status]["content"]["application/json"]["schema"]["$ref"]
        assert ref.endswith("/ErrorBody"), status
    admin = spec["paths"]["/v1/admin/reload"]["post"]["responses"]
    assert {"401", "403", "404", "409"} <= set(admin)
    body = spec["components"]["schemas"]["ErrorBody"]
    assert set(body["properties"]) == {"type", "message", "field"}
