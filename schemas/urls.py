"""Credentials in URLs: found in a config value (refused there), and hidden in every log line or message that shows a URL.

A URL's credentials are its userinfo (``user:password@`` before the host) and query parameters whose
name says they hold a secret (``?password=``, ``?api_key=``, ``?token=``). Pure functions of the
text, standard library only: the run config's validators (:mod:`schemas.run_config`) and the code that
logs URLs (the Tinker client, the status reader, the CLI) share them.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

SECRET_QUERY_WORDS = ("password", "passwd", "secret", "token", "api_key", "apikey")
"""A query parameter whose lower-cased name contains one of these holds a credential."""
HIDDEN = "***"


def _authority_bounds(url: str) -> tuple[int, int] | None:
    """(start, end) of the authority (``user:password@host:port``) of ``scheme://...``, or None when there is none."""
    scheme_end = url.find("://")
    if scheme_end < 0:
        return None
    start = scheme_end + 3
    end = len(url)
    for mark in "/?#":
        found = url.find(mark, start)
        if 0 <= found < end:
            end = found
    return start, end


def userinfo(url: str) -> str | None:
    """The userinfo of a URL (what stands before the last ``@`` of its authority), or None when it has none."""
    bounds = _authority_bounds(url)
    if bounds is None:
        return None
    authority = url[bounds[0] : bounds[1]]
    if "@" not in authority:
        return None
    return authority.rpartition("@")[0]


def has_password(url: str) -> bool:
    """True when the URL's userinfo holds a password (``user:password@`` or ``:password@``, an empty one aside)."""
    info = userinfo(url)
    return info is not None and info.partition(":")[2] != ""


def secret_query_names(url: str) -> list[str]:
    """Names of the URL's query parameters that hold a credential (``password``, ``api_key``, ``token``...)."""
    query_start = url.find("?")
    if query_start < 0:
        return []
    query = url[query_start + 1 :].partition("#")[0]
    names = [name for name, _ in parse_qsl(query, keep_blank_values=True)]
    return [name for name in names if any(word in name.lower() for word in SECRET_QUERY_WORDS)]


def credentials_problem(url: str, *, user_allowed: bool) -> str | None:
    """What credential the URL carries ("a user name and password", "a password", "the query parameter `token`"), or None.

    ``user_allowed``: a user name alone is not a credential (a database role); otherwise any userinfo is
    (in an HTTP API URL a lone ``user@`` may well be the key).
    """
    info = userinfo(url)
    if info is not None:
        if has_password(url):
            return "a user name and password (user:password@)" if info.partition(":")[0] else "a password (:password@)"
        if not user_allowed:
            return "userinfo (user@)"
    names = secret_query_names(url)
    if names:
        return f"the query parameter `{names[0]}`"
    return None


def redacted_url(url: str) -> str:
    """The URL fit for a log line: its password (and, in an http(s) URL, its whole userinfo) and secret query values as ``***``."""
    bounds = _authority_bounds(url)
    if bounds is not None:
        start, end = bounds
        authority = url[start:end]
        if "@" in authority:
            info, _, host = authority.rpartition("@")
            user, colon, _password = info.partition(":")
            if url[: start - 3].lower() in ("http", "https"):
                shown = HIDDEN
            else:
                shown = user + (colon and ":" + HIDDEN)
            url = url[:start] + shown + "@" + host + url[end:]
    names = set(secret_query_names(url))
    if names:
        head, _, rest = url.partition("?")
        query, hash_mark, fragment = rest.partition("#")
        parts = []
        for part in query.split("&"):
            name, equals, _value = part.partition("=")
            parts.append(f"{name}={HIDDEN}" if equals and any(word in name.lower() for word in SECRET_QUERY_WORDS) else part)
        url = head + "?" + "&".join(parts) + hash_mark + fragment
    return url


def without_credentials(url: str, *, user_allowed: bool) -> str:
    """The URL with its credentials removed: the password (and the user name too unless ``user_allowed``) and every
    secret query parameter (for a URL stored before such URLs were refused)."""
    bounds = _authority_bounds(url)
    if bounds is not None and "@" in url[bounds[0] : bounds[1]]:
        start, end = bounds
        info, _, host = url[start:end].rpartition("@")
        user = info.partition(":")[0]
        url = url[:start] + (f"{user}@" if user_allowed and user else "") + host + url[end:]
    names = set(secret_query_names(url))
    if names:
        head, _, rest = url.partition("?")
        query, hash_mark, fragment = rest.partition("#")
        kept = [part for part in query.split("&") if part.partition("=")[0] not in names]
        url = head + ("?" + "&".join(kept) if kept else "") + hash_mark + fragment
    return url
