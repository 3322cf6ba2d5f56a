"""docker-compose.yml and docker/app.Dockerfile, checked without Docker: structure, scalability,
secrets only from the environment, and every `metarl` command line parsed by the real CLI parser."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from metarl_cli.arguments import build_parser
from workers.app import QUEUES

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "docker" / "app.Dockerfile"

# A minimal implementation of compose's variable interpolation (compose-spec "Interpolation").
_VAR = re.compile(r"\$(?:(?P<escaped>\$)|\{(?P<braced>[^}]*)\}|(?P<named>[A-Za-z_][A-Za-z0-9_]*)|(?P<bad>))")
_BRACED = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:-|-|:\?|\?|:\+|\+)(?P<arg>.*))?$", re.S)


class MissingVariable(Exception):
    pass


def interpolate(value: str, env: dict[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        if match.group("escaped"):
            return "$"
        if match.group("named"):
            return env.get(match.group("named"), "")
        if match.group("bad") is not None:
            raise AssertionError(f"invalid interpolation in {value!r}")
        braced = _BRACED.match(match.group("braced"))
        assert braced, f"invalid interpolation ${{{match.group('braced')}}} in {value!r}"
        name, op, arg = braced.group("name"), braced.group("op"), braced.group("arg")
        present, non_empty = name in env, bool(env.get(name))
        if op is None:
            return env.get(name, "")
        if op == ":-":
            return env[name] if non_empty else arg
        if op == "-":
            return env[name] if present else arg
        if op in (":?", "?"):
            if (op == ":?" and not non_empty) or (op == "?" and not present):
                raise MissingVariable(f"{name}: {arg}")
            return env[name]
        return arg if (non_empty if op == ":+" else present) else ""

    return _VAR.sub(replace, value)


def walk(node: Any, path: str = "") -> list[tuple[str, Any]]:
    """(path, value) for every scalar, and every key as ('path.<key>', key)."""
    found: list[tuple[str, Any]] = []
    if isinstance(node, dict):
        for key, child in node.items():
            found.append((f"{path}.<key>", key))
            found += walk(child, f"{path}.{key}")
    elif isinstance(node, list):
        for index, child in enumerate(node):
            found += walk(child, f"{path}[{index}]")
    else:
        found.append((path, node))
    return found


def render(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, dict):
        return {key: render(child, env) for key, child in node.items()}
    if isinstance(node, list):
        return [render(child, env) for child in node]
    if isinstance(node, str):
        return interpolate(node, env)
    return node


TEST_ENV = {
    "POSTGRES_PASSWORD": "pw-from-env",
    "FLOWER_BASIC_AUTH": "ops:auth-from-env",
    "METARL_EVAL_SECRET": "eval-secret-from-env-0123456789",
    "MINIO_ROOT_USER": "minio-user-from-env",
    "MINIO_ROOT_PASSWORD": "minio-pw-from-env",
}


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    assert COMPOSE.is_file(), "docker-compose.yml is missing at the repository root"
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(raw: dict[str, Any]) -> dict[str, Any]:
    return render(raw, TEST_ENV)["services"]


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {key: "" if value is None else str(value) for key, value in env.items()}


def command_lines(service: dict[str, Any]) -> list[list[str]]:
    """The command as argv lists; `sh -c SCRIPT` is split into its `exec`/plain commands."""
    command = service.get("command")
    if command is None:
        return []
    argv = shlex.split(command) if isinstance(command, str) else [str(part) for part in command]
    if argv[:2] != ["sh", "-c"]:
        return [argv]
    script = argv[2].replace("$$", "$")
    lines = []
    for part in re.split(r";|\bthen\b|\belse\b|\bfi\b", script):
        words = shlex.split(part.strip().removeprefix("if").strip()) if part.strip() else []
        if words and words[0] == "exec":
            words = words[1:]
        if words and words[0] in ("metarl", "celery"):
            lines.append(words)
    assert lines, f"no command found in {script!r}"
    return lines


def app_services(services: dict[str, Any]) -> dict[str, Any]:
    return {name: svc for name, svc in services.items() if svc.get("build") or "metarl" in str(svc.get("image", ""))}


# --------------------------------------------------------------------------------------------


def test_compose_parses_and_interpolates(raw: dict[str, Any]) -> None:
    assert isinstance(raw.get("services"), dict)
    for _path, value in walk(raw):
        if isinstance(value, str):
            interpolate(value, TEST_ENV)  # raises on malformed ${...}


def test_required_services(services: dict[str, Any]) -> None:
    expected = {"redis", "postgres", "flower", "migrate", "orchestrator", "metrics", *QUEUES}
    assert expected <= set(services), f"missing: {sorted(expected - set(services))}"


def test_dependencies_name_real_services(raw: dict[str, Any], services: dict[str, Any]) -> None:
    for name, service in services.items():
        depends = service.get("depends_on") or {}
        for dependency in depends if isinstance(depends, (list, dict)) else []:
            assert dependency in services, f"{name} depends on unknown service {dependency}"
    declared = set(raw.get("volumes") or {})
    for name, service in services.items():
        for volume in service.get("volumes") or []:
            source = volume.split(":", 1)[0] if isinstance(volume, str) else volume.get("source", "")
            if source and not source.startswith((".", "/", "~")):
                assert source in declared, f"{name} uses undeclared volume {source}"


@pytest.mark.parametrize("pool", QUEUES)
def test_one_scalable_service_per_pool(pool: str, services: dict[str, Any]) -> None:
    service = services[pool]
    (argv,) = command_lines(service)
    assert argv[:4] == ["metarl", "worker", "--pool", pool]
    args = build_parser().parse_args(argv[1:])
    assert args.pool == pool and args.concurrency >= 1
    if pool != "outer":  # Flower can resize only a pool started with --autoscale (tests/integration/test_flower.py)
        assert args.autoscale is not None and args.autoscale.split(",")[0] == args.autoscale.split(",")[1], args.autoscale
    # `docker compose up --scale <pool>=N` needs: no fixed name, no published host port, no fixed hostname.
    for key in ("container_name", "ports", "hostname"):
        assert key not in service, f"{pool}: `{key}` prevents --scale"
    assert "replicas" not in (service.get("deploy") or {}), f"{pool}: deploy.replicas overrides --scale"
    assert service.get("depends_on", {}).get("migrate", {}).get("condition") == "service_completed_successfully"


def test_outer_pool_runs_one_update_at_a_time(services: dict[str, Any]) -> None:
    (argv,) = command_lines(services["outer"])
    args = build_parser().parse_args(argv[1:])
    assert args.concurrency == 1 and args.autoscale is None


def test_every_metarl_command_line_parses(services: dict[str, Any]) -> None:
    parser = build_parser()
    seen = 0
    for _name, service in services.items():
        for argv in command_lines(service):
            if argv[0] == "metarl":
                parser.parse_args(argv[1:])
                seen += 1
    assert seen >= len(QUEUES) + 3


def test_app_services_get_database_and_broker_from_env(services: dict[str, Any]) -> None:
    apps = app_services(services)
    assert set(QUEUES) | {"migrate", "orchestrator", "metrics", "flower"} <= set(apps)
    for name, service in apps.items():
        env = environment(service)
        assert env.get("METARL_BROKER_URL", "").startswith("redis://redis:6379/"), name
        if name != "flower":
            assert env.get("METARL_DATABASE_URL", "").startswith("postgresql"), name
            assert "@postgres:5432/" in env["METARL_DATABASE_URL"], name
            assert "pw-from-env" in env["METARL_DATABASE_URL"], f"{name}: the password must come from POSTGRES_PASSWORD"


def test_migrate_is_a_one_shot_everything_waits_for(services: dict[str, Any]) -> None:
    migrate = services["migrate"]
    assert command_lines(migrate) == [["metarl", "db", "upgrade"]]
    assert str(migrate.get("restart", "no")) == "no"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("orchestrator", "metrics", *QUEUES):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully", name


def test_orchestrator_runs_or_resumes_without_workers(services: dict[str, Any]) -> None:
    lines = command_lines(services["orchestrator"])
    commands = {argv[1] for argv in lines}
    assert commands == {"run", "resume"}
    for argv in lines:
        args = build_parser().parse_args([part.replace("${METARL_RUN_ID}", "r").replace("${METARL_RUN_CONFIG}", "c.toml") for part in argv[1:]])
        assert args.no_workers, f"the orchestrator must not spawn pools: {argv}"
    env = environment(services["orchestrator"])
    assert env["METARL_RUN_CONFIG"], "a default run config"
    assert (REPO / env["METARL_RUN_CONFIG"]).is_file(), "the default run config ships in the image"


def test_metrics_listens_on_all_interfaces_but_publishes_on_loopback(services: dict[str, Any]) -> None:
    (argv,) = command_lines(services["metrics"])
    args = build_parser().parse_args(argv[1:])
    assert args.command == "metrics" and args.host == "0.0.0.0"
    assert any(str(port).startswith("127.0.0.1:") and str(port).endswith(f":{args.port}") for port in services["metrics"]["ports"])


def test_flower(services: dict[str, Any], raw: dict[str, Any]) -> None:
    flower = services["flower"]
    (argv,) = command_lines(flower)
    assert argv[:4] == ["celery", "-A", "workers.app", "flower"]
    assert "--port=5555" in argv
    (auth,) = [part for part in argv if part.startswith("--basic-auth=")]
    assert auth in ("--basic-auth=${FLOWER_BASIC_AUTH}", "--basic-auth=$FLOWER_BASIC_AUTH"), auth
    # In the file, the flower env var is required from the host environment, with no default.
    raw_env = raw["services"]["flower"]["environment"]
    assert re.fullmatch(r"\$\{FLOWER_BASIC_AUTH(:\?[^}]*)?\}", raw_env["FLOWER_BASIC_AUTH"]), raw_env
    assert environment(flower)["FLOWER_BASIC_AUTH"] == TEST_ENV["FLOWER_BASIC_AUTH"]
    assert any(str(port).startswith("127.0.0.1:") and str(port).endswith(":5555") for port in flower["ports"])


@pytest.mark.parametrize("variable", sorted(TEST_ENV))
def test_secrets_are_required_from_the_environment(raw: dict[str, Any], variable: str) -> None:
    env = {key: value for key, value in TEST_ENV.items() if key != variable}
    with pytest.raises(MissingVariable, match=variable):
        render(raw, env)


SECRET_KEY = re.compile(r"PASSWORD|SECRET|TOKEN|API_KEY|BASIC_AUTH|PASSWD", re.I)
ONLY_INTERPOLATION = re.compile(r"^\$\{[A-Za-z_][A-Za-z0-9_]*(:?\?[^}]*|:-|-)?\}$")


def test_no_literal_secrets(raw: dict[str, Any]) -> None:
    text = COMPOSE.read_text()
    for path, value in walk(raw):
        if not isinstance(value, str):
            continue
        # env entries whose name says "secret": the value is only an interpolation (an empty default at most)
        key = path.rsplit(".", 1)[-1]
        if ".environment." in f"{path}." and SECRET_KEY.search(key):
            assert ONLY_INTERPOLATION.match(value), f"{path} = {value!r} is a literal secret"
        # user:password@ in URLs: the password part is an interpolation
        for match in re.finditer(r"://([^/:@\s]+):([^@\s]+)@", value):
            assert match.group(2).startswith("${"), f"{path}: literal password in URL {value!r}"
        # --basic-auth / --password flags take variables only
        for match in re.finditer(r"--(?:basic-auth|password|auth)[= ]\"?([^\s\"]+)", value):
            assert match.group(1).startswith("$"), f"{path}: literal credential {match.group(0)!r}"
    for word in ("password=", "changeme", "secret123", "hunter2"):
        assert word not in text.lower().replace("postgres_password=...", "").replace("password=...", ""), word


def test_dockerfile_installs_cpu_torch_first() -> None:
    text = DOCKERFILE.read_text()
    lines = [line.strip() for line in text.splitlines()]
    torch_line = next(i for i, line in enumerate(lines) if "torch==2.13.0" in line)
    assert "download.pytorch.org/whl/cpu" in lines[torch_line]
    project_line = next(i for i, line in enumerate(lines) if re.search(r"pip install .*(--no-deps )?\.(\s|$)", line))
    assert torch_line < project_line, "torch must be installed before the project"
    assert re.search(r"^FROM python:3\.11", text, re.M)
    assert re.search(r"^USER (?!root)", text, re.M), "run as a non-root user"
    assert "flower" in text, "the image runs the flower service too"


def test_compose_builds_the_dockerfile(raw: dict[str, Any]) -> None:
    for name, service in app_services(raw["services"]).items():
        build = service.get("build")
        if build:
            assert (REPO / build.get("context", ".") / build["dockerfile"]).resolve() == DOCKERFILE.resolve(), name
