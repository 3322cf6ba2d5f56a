"""Issue 40, item 5: credentials never in config values. A URL carrying userinfo (or a password, where a
user name alone is fine) is refused in every URL field of the run config, naming the field and the
environment variable that takes it instead; no error shows the secret; log lines show URLs redacted."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import pytest
import tinker

from metarl.backends.tinker import client as tinker_client
from metarl.store.status import without_password
from schemas.base import ConfigError, parse_toml_text, validate_model
from schemas.run_config import RunConfig, stored_run_config, stored_without_credentials
from schemas.urls import credentials_problem, has_password, redacted_url, secret_query_names, userinfo, without_credentials

REPO = Path(__file__).resolve().parents[2]
SECRET = "test-credential-not-a-key-0123456789"


def refused(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        validate_model(RunConfig, parse_toml_text(text, "run.toml"), "run.toml")
    return info.value


def tinker_text(agent_url: str, outer_url: str) -> str:
    text = (REPO / "examples" / "tinker.toml").read_text()
    for table, url in (("[backends.agent]", agent_url), ("[backends.outer]", outer_url)):
        old = f'{table}\ntype = "tinker"'
        assert old in text
        text = text.replace(old, f'{old}\nbase_url = "{url}"', 1)
    return text


def sim_text(extra: str) -> str:
    return (REPO / "examples" / "sim.toml").read_text() + "\n" + extra


@pytest.mark.parametrize(
    "url",
    [f"https://user:{SECRET}@tinker.example/v1", f"https://{SECRET}@tinker.example", f"https://tinker.example/v1?api_key={SECRET}"],
)
def test_a_key_inside_the_tinker_base_url_is_refused_naming_both_fields_and_the_variable(url: str) -> None:
    err = refused(tinker_text(url, url))
    fields = sorted(problem.field for problem in err.problems)
    assert fields == ["backends.agent.base_url", "backends.outer.base_url"], err.render()
    for problem in err.problems:
        assert "TINKER_API_KEY" in problem.fix and "credentials" in problem.message
    assert SECRET not in err.render() and SECRET not in repr(err.problems)


def test_the_validation_error_itself_does_not_carry_the_key() -> None:
    data = parse_toml_text(tinker_text(f"https://user:{SECRET}@tinker.example", f"https://user:{SECRET}@tinker.example"), "run.toml")
    with pytest.raises(ValueError) as info:
        RunConfig.model_validate(data)
    assert SECRET not in str(info.value) and SECRET not in repr(info.value)


@pytest.mark.parametrize(
    ("table", "field", "url", "variable"),
    [
        ("services", "database_url", f"postgresql+psycopg://postgres:{SECRET}@127.0.0.1:5432/metarl", "METARL_DATABASE_URL"),
        ("services", "database_url", f"postgresql+psycopg://postgres@127.0.0.1:5432/metarl?password={SECRET}", "METARL_DATABASE_URL"),
        ("services", "broker_url", f"redis://:{SECRET}@127.0.0.1:6379/0", "METARL_BROKER_URL"),
        ("artifacts", "root", f"s3://AKIAEXAMPLE:{SECRET}@bucket/prefix", "AWS_SECRET_ACCESS_KEY"),
    ],
)
def test_a_password_in_any_other_url_field_is_refused_with_the_environment_variable(table: str, field: str, url: str, variable: str) -> None:
    err = refused(sim_text(f'[{table}]\n{field} = "{url}"\n'))
    assert [problem.field for problem in err.problems] == [f"{table}.{field}"], err.render()
    assert variable in err.problems[0].fix
    assert SECRET not in err.render()


def test_a_user_name_without_password_stays_allowed_where_it_is_a_role() -> None:
    text = sim_text('[services]\ndatabase_url = "postgresql+psycopg://postgres@127.0.0.1:5432/metarl"\nbroker_url = "redis://127.0.0.1:6379/1"\n')
    config = validate_model(RunConfig, parse_toml_text(text, "run.toml"), "run.toml")
    assert config.services.database_url == "postgresql+psycopg://postgres@127.0.0.1:5432/metarl"


def test_assignment_is_checked_too() -> None:
    config = validate_model(RunConfig, parse_toml_text(sim_text(""), "run.toml"), "run.toml")
    with pytest.raises(ValueError, match="credentials"):
        config.services.broker_url = f"redis://:{SECRET}@127.0.0.1:6379/0"


@pytest.mark.parametrize(
    ("url", "info", "password", "problem_with_user", "problem_without_user"),
    [
        ("https://host/x", None, False, None, None),
        ("https://u@host/x", "u", False, None, "userinfo (user@)"),
        ("https://u:p@host/x", "u:p", True, "a user name and password (user:password@)", "a user name and password (user:password@)"),
        ("redis://:p@host:6379/0", ":p", True, "a password (:password@)", "a password (:password@)"),
        ("postgresql://u:@host/db", "u:", False, None, "userinfo (user@)"),
        ("https://host/a@b", None, False, None, None),  # an @ in the path is not userinfo
        ("https://u:p@h@host/x", "u:p@h", True, "a user name and password (user:password@)", "a user name and password (user:password@)"),
        ("relative/folder", None, False, None, None),
        ("https://host/x?token=t&a=1", None, False, "the query parameter `token`", "the query parameter `token`"),
    ],
)
def test_credentials_are_found_in_userinfo_and_query(
    url: str, info: str | None, password: bool, problem_with_user: str | None, problem_without_user: str | None
) -> None:
    assert userinfo(url) == info
    assert has_password(url) is password
    assert credentials_problem(url, user_allowed=True) == problem_with_user
    assert credentials_problem(url, user_allowed=False) == problem_without_user


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://user:sk-1@host/v1", "https://***@host/v1"),
        ("https://sk-1@host", "https://***@host"),
        ("postgresql+psycopg://postgres:pw@127.0.0.1/db", "postgresql+psycopg://postgres:***@127.0.0.1/db"),
        ("postgresql+psycopg://postgres@127.0.0.1/db", "postgresql+psycopg://postgres@127.0.0.1/db"),
        ("redis://:pw@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        ("https://host/v1?api_key=sk-1&x=2#f", "https://host/v1?api_key=***&x=2#f"),
        ("https://host/v1", "https://host/v1"),
    ],
)
def test_urls_are_redacted_for_logs(url: str, shown: str) -> None:
    assert redacted_url(url) == shown
    assert without_password(url) == shown
    assert secret_query_names(shown) == secret_query_names(url)


def test_connect_logs_the_base_url_without_its_userinfo(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(tinker_client, "_SERVICES", {})
    monkeypatch.setattr(tinker_client, "_GATEWAYS", {})
    monkeypatch.setenv("TINKER_API_KEY", "tml-env-key-0123456789")
    monkeypatch.setattr(tinker, "ServiceClient", lambda **kwargs: object())
    caplog.set_level(logging.INFO)
    tinker_client.connect(f"https://user:{SECRET}@127.0.0.1:9/v1", 10.0)
    assert "connected" in caplog.text and "127.0.0.1:9" in caplog.text
    assert SECRET not in caplog.text


@pytest.mark.parametrize(
    ("url", "user_allowed", "expected"),
    [
        (f"postgresql://metarl:{SECRET}@db:5432/metarl", True, "postgresql://metarl@db:5432/metarl"),
        (f"https://user:{SECRET}@tinker.example/v1", False, "https://tinker.example/v1"),
        (f"https://tinker.example/v1?region=eu&api_key={SECRET}#top", False, "https://tinker.example/v1?region=eu#top"),
        (f"redis://:{SECRET}@broker:6379/0?token={SECRET}", True, "redis://broker:6379/0"),
        ("postgresql://metarl@db/metarl", True, "postgresql://metarl@db/metarl"),
    ],
)
def test_without_credentials_leaves_a_url_the_validators_accept(url: str, user_allowed: bool, expected: str) -> None:
    cleaned = without_credentials(url, user_allowed=user_allowed)
    assert cleaned == expected and credentials_problem(cleaned, user_allowed=user_allowed) is None


def test_a_run_stored_with_a_password_in_its_services_url_still_loads_without_it() -> None:
    config = validate_model(RunConfig, parse_toml_text(sim_text(""), "run.toml"), "run.toml")
    stored = config.model_dump(mode="json")
    stored["services"]["database_url"] = f"postgresql://metarl:{SECRET}@db:5432/metarl"
    with pytest.raises(ValueError):
        RunConfig.model_validate(copy.deepcopy(stored))  # the validators blank the secret in the mapping they are given
    loaded = stored_run_config(stored)
    assert loaded.services.database_url == "postgresql://metarl@db:5432/metarl"
    assert SECRET not in json.dumps(stored_without_credentials(stored)) and SECRET in json.dumps(stored)
