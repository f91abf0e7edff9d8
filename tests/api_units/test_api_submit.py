"""The job-creating routes' JSON answers are starlette's JSONResponse, byte for byte."""

from __future__ import annotations

import pytest
from starlette.responses import JSONResponse

from api.submit import JsonResponse

BODY = {"id": "j1", "state": "queued", "output": "héllo ☃ \u2028", "n": [1, 2.5, None, True], "nested": {}}


def test_same_bytes_and_headers_as_starlette() -> None:
    ours = JsonResponse(BODY, status_code=202, headers=[(b"location", b"/v1/jobs/j1")])
    theirs = JSONResponse(BODY, status_code=202, headers={"Location": "/v1/jobs/j1"})
    assert ours.status_code == theirs.status_code
    assert ours.body == theirs.body
    assert ours.raw_headers == theirs.raw_headers


def test_nan_is_refused_like_starlette() -> None:
    with pytest.raises(ValueError):
        JSONResponse({"x": float("nan")})
    with pytest.raises(ValueError):
        JsonResponse({"x": float("nan")})
