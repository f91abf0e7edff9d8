"""Standard Webhooks signing and verification (common/webhook_signing.py)."""

from __future__ import annotations

import time

import pytest

from common.webhook_signing import WebhookVerificationError, sign, verify

# The published Standard Webhooks test vector (reference libraries' tests).
VECTOR_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
VECTOR_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
VECTOR_TS = 1614265330
VECTOR_BODY = b'{"test": 2432232314}'
VECTOR_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

SECRET = "whsec_c2VjcmV0LWtleS1mb3ItdGVzdHMtMDEyMzQ1Njc4OQ=="
OTHER_SECRET = "whsec_b3RoZXItc2VjcmV0LWtleS0wMTIzNDU2Nzg5YWJj"
BODY = b'{"type":"job.completed","data":{"id":"j1"}}'


def signed_headers(secret: str = SECRET, body: bytes = BODY, ts: int | None = None) -> dict[str, str]:
    ts = int(time.time()) if ts is None else ts
    signature = sign(secret, "j1", ts, body)
    return {"webhook-id": "j1", "webhook-timestamp": str(ts), "webhook-signature": signature}


def test_sign_reproduces_the_spec_test_vector() -> None:
    assert sign(VECTOR_SECRET, VECTOR_ID, VECTOR_TS, VECTOR_BODY) == VECTOR_SIGNATURE


def test_verify_accepts_the_spec_test_vector_within_tolerance() -> None:
    headers = {
        "webhook-id": VECTOR_ID,
        "webhook-timestamp": str(VECTOR_TS),
        "webhook-signature": VECTOR_SIGNATURE,
    }
    age_s = time.time() - VECTOR_TS
    verify(VECTOR_SECRET, headers, VECTOR_BODY, tolerance_s=age_s + 60)


def test_secret_prefix_is_optional() -> None:
    assert sign(VECTOR_SECRET.removeprefix("whsec_"), VECTOR_ID, VECTOR_TS, VECTOR_BODY) == VECTOR_SIGNATURE


def test_verify_accepts_a_fresh_signature_with_any_header_case() -> None:
    headers = {k.upper(): v for k, v in signed_headers().items()}
    verify(SECRET, headers, BODY)


def test_verify_accepts_any_of_several_signatures() -> None:
    # Given a rotation: one signature with the old secret, one with the current one, one unknown version
    headers = signed_headers()
    old = sign(OTHER_SECRET, "j1", int(headers["webhook-timestamp"]), BODY)
    headers["webhook-signature"] = f"v1a,abc {old} {headers['webhook-signature']}"
    # Then the current secret verifies, and the old one too
    verify(SECRET, headers, BODY)
    verify(OTHER_SECRET, headers, BODY)


@pytest.mark.parametrize("offset_s", [-301, 301])
def test_verify_rejects_timestamps_outside_the_tolerance(offset_s: int) -> None:
    headers = signed_headers(ts=int(time.time()) + offset_s)
    with pytest.raises(WebhookVerificationError, match="tolerance"):
        verify(SECRET, headers, BODY)


def test_tolerance_is_configurable() -> None:
    headers = signed_headers(ts=int(time.time()) - 1000)
    verify(SECRET, headers, BODY, tolerance_s=1200)


def test_verify_rejects_a_tampered_body() -> None:
    with pytest.raises(WebhookVerificationError, match="no webhook-signature"):
        verify(SECRET, signed_headers(), BODY + b" ")


def test_verify_rejects_another_secret() -> None:
    with pytest.raises(WebhookVerificationError):
        verify(SECRET, signed_headers(secret=OTHER_SECRET), BODY)


def test_verify_rejects_a_changed_id() -> None:
    headers = signed_headers()
    headers["webhook-id"] = "j2"
    with pytest.raises(WebhookVerificationError):
        verify(SECRET, headers, BODY)


def test_verify_ignores_other_signature_versions() -> None:
    headers = signed_headers()
    headers["webhook-signature"] = "v2," + headers["webhook-signature"].split(",", 1)[1]
    with pytest.raises(WebhookVerificationError):
        verify(SECRET, headers, BODY)


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_verify_requires_every_header(missing: str) -> None:
    headers = signed_headers()
    del headers[missing]
    with pytest.raises(WebhookVerificationError, match=missing):
        verify(SECRET, headers, BODY)


def test_verify_rejects_a_malformed_timestamp() -> None:
    headers = signed_headers()
    headers["webhook-timestamp"] = "soon"
    with pytest.raises(WebhookVerificationError, match="integer"):
        verify(SECRET, headers, BODY)


def test_a_secret_that_is_not_base64_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="base64"):
        sign("whsec_not base64!", "j1", 1, BODY)
