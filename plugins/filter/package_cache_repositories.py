"""Which repositories the package cache serves, as pure functions tested on their own.

The cache fetches for the nodes only from repository hosts: those the nodes' apt sources name,
those pycli's roles write into the sources later in the run (the role's vars,
__package_cache_role_repositories), and the site's package_cache_repositories. Anything else is refused by nginx, and so is
an address on the cache host itself (loopback) or on its link (link-local, where clouds answer
with instance metadata and credentials) whoever lists it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from urllib.parse import urlsplit

# How a source served over TLS is written with the cache (vars/main.yml, __package_cache_https_prefix).
HTTPS_PREFIX = re.compile(r"^http://https///", re.IGNORECASE)
URL = re.compile(r"\bhttps?://\S+", re.IGNORECASE)


def package_cache_source_urls(text: str) -> list[str]:
    """The repository URLs of apt's sources files (one-line and deb822), comments left out."""
    urls = []
    for line in text.splitlines():
        line = line.split("#", 1)[0]
        urls.extend(URL.findall(line))
    return urls


def _host(url: str) -> str:
    url = HTTPS_PREFIX.sub("https://", url.strip())
    try:
        return str(ipaddress.ip_address(url.strip("[]")))  # a bare address, IPv6 ones too
    except ValueError:
        pass
    try:
        host = urlsplit(url if "://" in url else f"//{url}").hostname or ""
    except ValueError:
        return ""
    return host.rstrip(".").lower()


def _refused(host: str) -> bool:
    """Whether the cache must never fetch from host: a loopback, link-local or unspecified address."""
    if host in ("localhost", "localhost.localdomain") or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_link_local or address.is_unspecified


def package_cache_repository_hosts(urls: Iterable[str]) -> list[str]:
    """The hosts of repository URLs (or bare host names), sorted, each once; refused ones left out."""
    hosts = {_host(url) for url in urls if url}
    return sorted(host for host in hosts if host and not _refused(host))


def package_cache_refused(urls: Iterable[str]) -> list[str]:
    """Those of `urls` (or host names) whose host the cache never fetches from, as given."""
    return [url for url in urls if _refused(_host(url))]


class FilterModule:
    def filters(self):
        return {
            "package_cache_source_urls": package_cache_source_urls,
            "package_cache_refused": package_cache_refused,
            "package_cache_repository_hosts": package_cache_repository_hosts,
        }
