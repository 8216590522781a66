"""The HTTP client rewheel's index checks, nightly look-ups and health checks use.

httpx loads the CA bundle `SSL_CERT_FILE` names when a client is made (for plain http URLs
too), and a path that is not a file ends there in a bare FileNotFoundError or
IsADirectoryError. Hosts whose images moved their CA bundle keep such a variable around, so it
is checked first and named. (A missing `SSL_CERT_DIR` is harmless to httpx: not checked.)
"""

from __future__ import annotations

import os
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


def client(**options: Any) -> httpx.Client:
    """An httpx.Client, once SSL_CERT_FILE is checked (`options` go to httpx.Client)."""
    check_tls_env()
    return httpx.Client(**options)
