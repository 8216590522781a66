"""The HTTP client rewheel's index checks, nightly look-ups and health checks use.

httpx loads the CA bundle `SSL_CERT_FILE` names when a client is made (for plain http URLs
too), and a path that is not a file ends there in a bare FileNotFoundError or
IsADirectoryError. Hosts whose images moved their CA bundle keep such a variable around, so it
is checked first and named. (A missing `SSL_CERT_DIR` is harmless to httpx: not checked.)

Loading the CA bundle costs about 40 ms, and one command makes several clients (the index
check, the nightly look-up, one health wait per start, some inside the service's downtime):
the TLS context is made once per process and per value of those two variables, and shared.
"""

from __future__ import annotations

import functools
import os
import ssl
from typing import Any

import httpx

from rewheel.errors import PreflightError


def check_tls_env() -> None:
    """PreflightError (exit 2) naming the variable and its path when SSL_CERT_FILE is set to
    something that is not a file."""
    value = os.environ.get("SSL_CERT_FILE")
    if value and not os.path.isfile(value):
        what = "a folder, not a file" if os.path.isdir(value) else "no such file"
        raise PreflightError(
            f"SSL_CERT_FILE={value}: {what} (the environment variable that names the CA "
            "certificates for HTTPS)",
            hint="point SSL_CERT_FILE at the host's CA bundle (Debian/Ubuntu: "
                 "/etc/ssl/certs/ca-certificates.crt) or unset it; nothing was changed")


@functools.lru_cache(maxsize=4)
def _tls_context(cert_file: str | None, cert_dir: str | None) -> ssl.SSLContext:
    # httpx reads both variables itself; they are the cache's key so a changed one is honoured.
    return httpx.create_ssl_context()


def client(**options: Any) -> httpx.Client:
    """An httpx.Client, once SSL_CERT_FILE is checked (`options` go to httpx.Client)."""
    check_tls_env()
    if "verify" not in options and options.get("trust_env", True):
        options["verify"] = _tls_context(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    return httpx.Client(**options)
