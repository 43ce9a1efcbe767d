"""Schemathesis hooks for scripts/api-fuzz.sh: raftq's own checks of every answer.

Loaded through SCHEMATHESIS_HOOKS. The documented error codes are read from the description
under test (the `code` enum of its Problem schema), so this file names none of them.
"""

import json

import schemathesis

PROBLEM_JSON = "application/problem+json"
PROBLEM_FIELDS = ("type", "title", "status", "detail", "code")


def _documented_codes(raw_schema):
    """The `code` enum of the description's Problem schema."""
    schemas = raw_schema["components"]["schemas"]
    code = schemas["Problem"]["properties"]["code"]
    ref = code.get("$ref")
    if ref:
        code = schemas[ref.rsplit("/", 1)[-1]]
    codes = code.get("enum") or []
    if not codes:
        raise AssertionError("the description's Problem.code lists no codes")
    return set(codes)


@schemathesis.check
def problem_with_documented_code(ctx, response, case):
    """Every error (status 400 and above) is an RFC 9457 problem, `application/problem+json`,
    with the answer's status and one of the documented codes."""
    if response.status_code < 400:
        return None
    content_type = (response.headers.get("content-type") or [""])[0]
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type != PROBLEM_JSON:
        raise AssertionError(
            f"status {response.status_code} answered with Content-Type {content_type!r}, "
            f"not {PROBLEM_JSON}: {response.text[:500]!r}"
        )
    try:
        body = json.loads(response.content)
    except ValueError as e:
        raise AssertionError(f"the problem body is not JSON ({e}): {response.text[:500]!r}")
    if not isinstance(body, dict):
        raise AssertionError(f"the problem body is not an object: {body!r}")
    missing = [f for f in PROBLEM_FIELDS if f not in body]
    if missing:
        raise AssertionError(f"the problem lacks {missing}: {body!r}")
    if body["status"] != response.status_code:
        raise AssertionError(
            f"the problem says status {body['status']}, the answer is {response.status_code}"
        )
    documented = _documented_codes(case.operation.schema.raw_schema)
    if body["code"] not in documented:
        raise AssertionError(
            f"code {body['code']!r} is not documented (documented: {sorted(documented)})"
        )
    return None
