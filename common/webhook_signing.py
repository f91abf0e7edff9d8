"""Standard Webhooks signing and verification, for the fleet's webhook sender and its tests.

The implementation is the SDK's (`atefleet.client.webhooks`), so a receiver that installs only the
SDK verifies callbacks with exactly the code that signs them.
"""

from atefleet.client.webhooks import (
    DEFAULT_TOLERANCE_S,
    SECRET_PREFIX,
    SIGNATURE_VERSION,
    WebhookVerificationError,
    secret_key,
    sign,
    verify,
)

__all__ = ["DEFAULT_TOLERANCE_S", "SECRET_PREFIX", "SIGNATURE_VERSION", "WebhookVerificationError",
           "secret_key", "sign", "verify"]
