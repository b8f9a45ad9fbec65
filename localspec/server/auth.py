"""Who may call the API: loopback needs nothing; another host needs LOCALSPEC_API_KEY unless --no-auth."""

from __future__ import annotations

import hmac
import ipaddress

from localspec.config import ConfigError, Environment

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}
API_KEY_ENV = "LOCALSPEC_API_KEY"


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def api_key_for(host: str, no_auth: bool, environ=None) -> str | None:
    """The key requests must carry (None: no check). Raises ConfigError for a non-loopback host without one."""
    key = Environment.read(environ).api_key
    if key is not None:
        return key
    if is_loopback(host) or no_auth:
        return None
    raise ConfigError(
        f"binding to {host} makes the API reachable from other machines; set {API_KEY_ENV} to a "
        f"secret key that clients send as 'Authorization: Bearer <key>' (or pass --no-auth on purpose)"
    )


def key_matches(expected: str, authorization: str | None) -> bool:
    """Constant-time comparison of 'Bearer <key>' with the expected key."""
    given = ""
    if authorization and authorization[:7].lower() == "bearer ":
        given = authorization[7:].strip()
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))
