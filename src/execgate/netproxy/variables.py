"""The variables that point a session's programs at its proxy.

Every exec re-receives them (the session's environment, and the interposer's re-injection),
so a program that drops them simply has no network; none of them widens anything.
"""

from __future__ import annotations

from typing import Final

#: Names set for a proxied session (HTTP clients, curl, pip, npm, yarn, git read these).
HTTP_PROXY_NAMES: Final = (
    "HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy",
    "npm_config_proxy", "npm_config_https_proxy", "NPM_CONFIG_PROXY", "NPM_CONFIG_HTTPS_PROXY",
    "YARN_HTTP_PROXY", "YARN_HTTPS_PROXY", "PIP_PROXY",
)  # fmt: skip
SOCKS_PROXY_NAMES: Final = ("ALL_PROXY", "all_proxy")
NO_PROXY_NAMES: Final = ("NO_PROXY", "no_proxy")
#: Marks a proxied session (the interposer re-injects the others only when it is set).
MARKER: Final = "EXECGATE_PROXY"

PROXY_VARIABLE_NAMES: Final = (MARKER, *HTTP_PROXY_NAMES, *SOCKS_PROXY_NAMES, *NO_PROXY_NAMES)


def proxy_variables(port: int) -> dict[str, str]:
    """The values for a proxy listening on 127.0.0.1:``port`` (HTTP and SOCKS5 on one port:
    the proxy tells them apart by the first byte)."""
    http = f"http://127.0.0.1:{port}"
    values = {MARKER: http}
    values.update(dict.fromkeys(HTTP_PROXY_NAMES, http))
    values.update(dict.fromkeys(SOCKS_PROXY_NAMES, f"socks5h://127.0.0.1:{port}"))
    values.update(dict.fromkeys(NO_PROXY_NAMES, "localhost,127.0.0.1,::1"))
    return values
