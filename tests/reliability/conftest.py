"""The reliability tests that need only one gateway use the session's `shared_gateway`
(tests/gateway_fixtures.py): auth, malformed-body, input-limit and log tests all talk to
the same `spec-gateway serve` (real vLLM CPU engine), whose log the no-content-in-logs
test reads, and which is checked for prompt text when the session ends."""

from __future__ import annotations

from tests.gateway_fixtures import LOG_MARKER

#: Tests put this in any prompt whose text must never reach a log.
MARKER = LOG_MARKER
