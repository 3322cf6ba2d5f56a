"""Guards of config values that must not hold secrets: API keys in a backend table, credentials in a URL.

Before-validators overwrite the offending value in the parsed mapping before the error is raised
(pydantic keeps the input next to each error, and a logged ValidationError must not carry it);
the run config (schemas/run_config.py) and the backends' config models use them.
"""

from __future__ import annotations

from pydantic_core import PydanticCustomError

from schemas.urls import credentials_problem

SECRET_KEYS = frozenset({"api_key", "apikey", "tinker_api_key", "key", "token", "secret"})
"""Keys of a backend table that would hold an API key (compared lower-cased, `-` as `_`)."""


def refuse_secrets(data: object, key_env: str, what: str, extra_keys: frozenset[str] = frozenset()) -> object:
    """Reject an API key written into a backend table (``what``, e.g. "the Tinker API key", read only from ``key_env``), without echoing it.

    The value is overwritten in the parsed mapping before the error is raised: pydantic keeps the
    input next to each error, and a logged ValidationError must not carry the key.
    """
    if isinstance(data, dict):
        found = sorted(str(key) for key in data if str(key).lower().replace("-", "_") in SECRET_KEYS | extra_keys)
        for key in list(data):
            if str(key) in found:
                data[key] = "(redacted)"
        if found:
            raise ValueError(
                f"`{found[0]}` must not be in the config: {what} is read only from the {key_env} environment variable; remove `{found[0]}` and export {key_env}"
            )
    return data


class RefusedUrl:
    """Stands in the parsed mapping for a URL that carries credentials, so that no error, repr or log shows the URL."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return "'(a URL with credentials, not shown)'"


def hide_url_credentials(data: object, fields: dict[str, bool]) -> object:
    """Replace each URL field (name -> whether a user name alone is allowed) that carries credentials by a :class:`RefusedUrl`.

    A before-validator of the model: pydantic keeps the input next to each error, and a logged
    ValidationError must not carry the key; the field's own validator (:func:`credential_free`) then refuses it.
    """
    if isinstance(data, dict):
        for name, user_allowed in fields.items():
            value = data.get(name)
            if isinstance(value, str):
                what = credentials_problem(value, user_allowed=user_allowed)
                if what is not None:
                    data[name] = RefusedUrl(what)
    return data


def credential_free(value: object, *, user_allowed: bool, fix: str) -> object:
    """``value`` unchanged, or a ``url_credentials`` error naming what the URL carries and the fix (an environment variable)."""
    what = value.what if isinstance(value, RefusedUrl) else credentials_problem(value, user_allowed=user_allowed) if isinstance(value, str) else None
    if what is not None:
        raise PydanticCustomError(
            "url_credentials",
            "the URL carries {what}: credentials never go in a config value (the run config is stored with the run and URLs are logged)",
            {"what": what, "fix": fix},
        )
    return value


DATABASE_URL_FIX = (
    "remove the password from the URL: put the whole URL in the METARL_DATABASE_URL environment variable instead (it wins over [services]), "
    "or give PostgreSQL the password through PGPASSWORD or ~/.pgpass"
)
BROKER_URL_FIX = "remove the password from the URL: put the whole URL in the METARL_BROKER_URL environment variable instead (it wins over [services])"
ARTIFACTS_URL_FIX = "remove the credentials from the URL: give the store's keys in its environment (for s3://, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
