"""Schemathesis against the live workbench service: property-based requests made from its own
OpenAPI document, with the admin token.

For every operation, valid (positive) and schema-breaking (negative) requests, for random names
and for names the hub knows (so quotas really get written): no 5xx, every status, content type
and body as documented, schema-breaking input refused with a 4xx, and a refused request (4xx)
that would change something changes nothing (``api/quotas`` before == after). Bounded to run
in well under 3 minutes on two cores; ``WORKBENCH_FUZZ_EXAMPLES`` (default 80) sets the examples
per operation, mode and name. The test prints how many cases it ran. It fuzzes the document the
service serves: ``openapi.yaml`` merged with the hub's backend's fragment.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from tests.service.conftest import shut_down, start_workbench_hub

pytestmark = pytest.mark.integration

EXAMPLES = int(os.environ.get("WORKBENCH_FUZZ_EXAMPLES", "80"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
KNOWN = {"users": "alice", "groups": "ml-course"}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    hub = start_workbench_hub(
        tmp_path_factory.mktemp("hub") / "hub", {"WORKBENCH_SIMULATED_GPUS": "2xH100-80GB,2xA100-40GB"}
    )
    hub.create_users("alice", "bob")
    assert hub.api("POST", "/groups/ml-course", json={"users": ["bob"]}).status_code in (201, 409)
    yield hub
    shut_down(hub)


def test_schemathesis_finds_no_failure(hub, capsys):
    base_url = f"{hub.url}/services/workbench"
    # The token is sent as given (not fuzzed: refusals without one are tested in test_service_api),
    # and query strings carry the documented parameters only (the service ignores others, as
    # most APIs do, which schemathesis would count as accepting bad input).
    config = SchemathesisConfig.from_dict(
        {"generation": {"with-security-parameters": False, "allow-extra-parameters": False}}
    )
    schema = schemathesis.openapi.from_url(f"{base_url}/api/openapi.json", config=config)
    headers = {"Authorization": f"token {hub.token}"}
    ran: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    failures: list[str] = []

    def quotas():
        r = hub.service("GET", "api/quotas", validate=False)
        assert r.status_code == 200, r.text
        return r.json()

    def fuzzed(strategy, method: str, label: str, checks: list) -> Callable[[], None]:
        """One operation and mode's hypothesis test (the loop's values bound here, where it is made)."""

        @given(case=strategy)
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        def run(case):
            before = quotas() if method != "GET" else None
            response = case.call(base_url=base_url, headers=headers, timeout=30)
            ran[label] += 1
            statuses[f"{method} {response.status_code}"] += 1
            case.validate_response(response, checks=checks, headers=headers)
            if before is not None and 400 <= response.status_code < 500:
                assert quotas() == before, f"a refused {method} ({response.status_code}) changed quotas"

        return run

    operations = [result.ok() for result in schema.get_all_operations()]
    # Every operation of the document the service serves (its openapi.yaml merged with the backend's
    # fragment, shared responses and parameters by reference) is one schemathesis fuzzes; loaded from
    # its URL, schemathesis leaves out the operation that serves the document itself.
    served = hub.openapi()
    assert {(o.method.lower(), o.path) for o in operations} == {
        (method, path) for path, item in served["paths"].items() for method in item if method != "parameters"
    } - {("get", "/api/openapi.json")}
    for operation in operations:
        if operation.path == "/":
            continue  # the HTML page logs in through the hub's OAuth; its answers are checked elsewhere
        method = operation.method.upper()
        kind = next((k for k in KNOWN if operation.path.startswith(f"/api/quotas/{k}/")), None)
        variants = [None, {"name": KNOWN[kind]}] if kind else [None]
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            for path_parameters in variants:
                checks = CHECKS + ([negative_data_rejection] if mode is GenerationMode.NEGATIVE else [])
                strategy = operation.as_strategy(generation_mode=mode, path_parameters=path_parameters)
                label = f"{method} {operation.path} {mode.value}{' ' + KNOWN[kind] if path_parameters else ''}"
                try:
                    fuzzed(strategy, method, label, checks)()
                except Unsatisfiable:
                    # Negative mode on an operation without parameters or body: nothing to break.
                    assert mode is GenerationMode.NEGATIVE, label
                except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - one operation's failure must not hide the others'
                    failures.append(f"{label}: {str(exc)[:2000]}")
    total = sum(ran.values())
    with capsys.disabled():
        print(
            f"\nschemathesis: {total} cases over {len(ran)} operation/mode/name runs, "
            f"{len(failures)} failure(s); answers: {', '.join(f'{k}: {v}' for k, v in sorted(statuses.items()))}"
        )
    assert not failures, "\n\n".join(failures)
    assert total >= EXAMPLES * 10, ran
    assert statuses["PUT 200"], statuses
    assert statuses["PUT 400"], statuses
    assert statuses["DELETE 204"], statuses
