"""Database engine, sessions and Alembic migrations (PostgreSQL only)."""

from __future__ import annotations

import contextlib
import select
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import psycopg
from sqlalchemy import Connection, Engine, create_engine, event, exc, text
from sqlalchemy.orm import Session, sessionmaker

from metarl.store.migration_head import MIGRATIONS_DIR, head_revision, normalise_url

if TYPE_CHECKING:
    from alembic.config import Config as AlembicConfig


DATABASE_UNREACHABLE: tuple[type[exc.DBAPIError], ...] = (exc.OperationalError, exc.InterfaceError)
"""What a database that went away (restart, network) raises through a session or :func:`run_sql`: callers that wait for it catch these."""


def unreachable_reason(err: exc.DBAPIError) -> str:
    """`DriverError: message` of a DATABASE_UNREACHABLE error, its message cut to 200 characters (pure)."""
    cause = err.orig or err
    return f"{type(cause).__name__}: {str(cause).strip()[:200]}"


_ENGINES: dict[str, Engine] = {}
_SESSION_FACTORIES: dict[str, sessionmaker[Session]] = {}


def server_closed(dbapi_connection: Any) -> bool:
    """True when an idle pooled connection has something to read: the server closed it (a restart, a
    terminated backend) or sent an unsolicited message. An idle connection in good health has nothing.

    A zero-timeout poll of the socket, so no round trip (a pre-ping costs one per checkout).
    """
    fileno = dbapi_connection.fileno()
    if hasattr(select, "poll"):  # no limit on descriptor numbers (select() stops at 1024)
        poller = select.poll()
        poller.register(fileno, select.POLLIN | select.POLLERR | select.POLLHUP)
        return bool(poller.poll(0))
    readable, _, _ = select.select([fileno], [], [], 0)
    return bool(readable)


def _discard_closed(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    if dbapi_connection.closed or server_closed(dbapi_connection):
        raise exc.DisconnectionError("the server closed this pooled connection")  # the pool reconnects


def get_engine(url: str) -> Engine:
    """One pooled engine per URL per process; a checkout replaces a connection the server closed (see `server_closed`)."""
    engine = _ENGINES.get(url)
    if engine is None:
        engine = create_engine(normalise_url(url), pool_size=5, max_overflow=5)
        event.listen(engine.pool, "checkout", _discard_closed)
        _ENGINES[url] = engine
    return engine


def dispose_engines() -> None:
    """Forget pooled connections inherited from a parent process (call after fork)."""
    for engine in _ENGINES.values():
        engine.dispose(close=False)
    _ENGINES.clear()
    _SESSION_FACTORIES.clear()


def warm_pool(url: str) -> None:
    """Open the engine's first pooled connection now (server version, type info: about 10 ms of round trips), so the
    first unit of work does not pay for it; raises SQLAlchemy's errors when the database cannot be reached."""
    get_engine(url).raw_connection().close()


def session_factory(url: str) -> sessionmaker[Session]:
    """One session factory per URL per process (building one makes a Session subclass: about 1 ms of CPU)."""
    factory = _SESSION_FACTORIES.get(url)
    if factory is None:
        factory = sessionmaker(bind=get_engine(url), expire_on_commit=False, future=True)
        _SESSION_FACTORIES[url] = factory
    return factory


@contextlib.contextmanager
def session_scope(url: str) -> Iterator[Session]:
    """A session whose transaction commits on success and rolls back on any error."""
    session = session_factory(url)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


class SqlRows:
    """The rows of one statement sent by :func:`run_sql`, fetched at once (plain tuples)."""

    __slots__ = ("rows",)

    def __init__(self, rows: list[tuple[Any, ...]]):
        self.rows = rows

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.rows)

    def first(self) -> tuple[Any, ...] | None:
        return self.rows[0] if self.rows else None

    def one(self) -> tuple[Any, ...]:
        if len(self.rows) != 1:
            raise exc.NoResultFound("no row returned") if not self.rows else exc.MultipleResultsFound(f"{len(self.rows)} rows returned")
        return self.rows[0]

    def scalar_one(self) -> Any:
        return self.one()[0]


StatementObserver = Callable[[str], None]
_statement_observers: list[StatementObserver] = []


@contextlib.contextmanager
def observing_statements(observer: StatementObserver) -> Iterator[None]:
    """Call `observer(statement)` for every statement :func:`run_sql` sends meanwhile, and `observer("COMMIT")` for
    every commit of a :func:`sql_transaction` (the bench counts with it).

    Neither goes through SQLAlchemy's execution, so they fire no engine events.
    """
    _statement_observers.append(observer)
    try:
        yield
    finally:
        _statement_observers.remove(observer)


class SqlTransaction:
    """One pooled psycopg connection for the statements of :func:`run_sql`, without an ORM session.

    Made by :func:`sql_transaction`. Stage messages record their work through it: a SQLAlchemy
    ``Session`` costs more client CPU per transaction than the statements it carries.
    """

    __slots__ = ("dbapi_connection", "dialect", "pooled")

    def __init__(self, pooled: Any, dialect: Any):
        self.pooled = pooled
        self.dialect = dialect
        self.dbapi_connection: psycopg.Connection = pooled.dbapi_connection

    def invalidate(self, err: BaseException) -> None:
        """Drop the connection instead of pooling it again (the server closed it)."""
        self.pooled.invalidate(err)

    def rollback(self) -> None:
        """Undo the transaction's statements so far (nothing in autocommit)."""
        try:
            self.dbapi_connection.rollback()
        except psycopg.Error as err:
            raise database_error(self, err, "ROLLBACK", {}) from err


SqlTarget = Session | SqlTransaction
"""What :func:`run_sql` sends on: an ORM session's transaction, or a :class:`SqlTransaction`."""


@contextlib.contextmanager
def sql_transaction(url: str, *, autocommit: bool = False) -> Iterator[SqlTransaction]:
    """A pooled connection whose statements commit together on success and roll back on any error.

    With `autocommit`, each statement commits on its own: for a unit of work that is one statement
    (no BEGIN and COMMIT round trips). Errors come out as SQLAlchemy's exceptions, as from a session.
    """
    engine = get_engine(url)
    pooled = engine.raw_connection()
    target = SqlTransaction(pooled, engine.dialect)
    connection = target.dbapi_connection
    try:
        if autocommit:
            connection.autocommit = True
        yield target
        if not autocommit:
            try:
                connection.commit()
            except psycopg.Error as err:
                raise database_error(target, err, "COMMIT", {}) from err
            for observe in _statement_observers:
                observe("COMMIT")
    except BaseException:
        if not connection.closed and not autocommit:
            with contextlib.suppress(psycopg.Error):
                connection.rollback()
        raise
    finally:
        if autocommit and not connection.closed:
            try:
                connection.autocommit = False
            except psycopg.Error as err:  # a connection in a bad state is not pooled again
                pooled.invalidate(err)
        pooled.close()


def run_sql(session: SqlTarget, statement: str, params: Mapping[str, Any]) -> SqlRows:
    """Run one statement as written (psycopg ``%(name)s`` parameters) in the session's transaction.

    The statements every stage message runs use this. It sends them on the psycopg connection
    directly, without SQLAlchemy's statement execution and result objects: that cut the client CPU
    of the replayed stage functions by about 40% (`bench.pipeline_overhead`). Errors still come out
    as SQLAlchemy's exceptions (`OperationalError`, `IntegrityError`, ...), and a connection the
    server dropped is invalidated, as with ``session.execute``.
    """
    target = statement_target(session)
    try:
        with driver_connection(target).cursor() as cursor:
            cursor.execute(statement, params)
            result = cursor.pgresult  # its status, not `cursor.description`: that builds a Column object per column on every call
            rows = cursor.fetchall() if result is not None and result.status == psycopg.pq.ExecStatus.TUPLES_OK else []
    except psycopg.Error as err:
        raise database_error(target, err, statement, params) from err
    for observe in _statement_observers:
        observe(statement)
    return SqlRows(rows)


def statement_target(session: SqlTarget) -> Connection | SqlTransaction:
    """What a session's statements go through: the :class:`SqlTransaction` itself, or the ORM session's connection."""
    return session if isinstance(session, SqlTransaction) else session.connection()


def driver_connection(connection: Connection | SqlTransaction) -> psycopg.Connection:
    """The psycopg connection under a SQLAlchemy connection or a :class:`SqlTransaction`."""
    driver = connection.dbapi_connection if isinstance(connection, SqlTransaction) else connection.connection.dbapi_connection
    assert isinstance(driver, psycopg.Connection), "the engine's driver is psycopg"
    return driver


def psycopg_connection(session: SqlTarget) -> psycopg.Connection:
    """The psycopg connection a session's statements go through (in its transaction): for code that reads with plain SQL."""
    return driver_connection(statement_target(session))


def database_error(connection: Connection | SqlTransaction, err: psycopg.Error, statement: str, params: Mapping[str, Any]) -> BaseException:
    """SQLAlchemy's exception for a driver error of :func:`run_sql`; a dropped connection is invalidated (not pooled again)."""
    dialect = connection.dialect
    disconnected = dialect.is_disconnect(err, driver_connection(connection), None)  # type: ignore[arg-type]  # psycopg's types are the DB-API's
    if disconnected:
        connection.invalidate(err)
    return exc.DBAPIError.instance(statement, dict(params), err, psycopg.Error, connection_invalidated=disconnected, dialect=dialect)


def text_array_literal(values: Iterable[str]) -> str:
    """A constant text array written into a statement (`ARRAY['a','b']::text[]`), so it is not a parameter to adapt on every call.

    Only for the code's own constants (stage and status names); quotes are doubled all the same.
    """
    quoted = ", ".join("'" + value.replace("'", "''") + "'" for value in values)
    return f"ARRAY[{quoted}]::text[]"


def json_param(value: Any) -> Any:
    """A parameter for a JSON column in :func:`run_sql` (psycopg does not guess JSON from a dict or list)."""
    from psycopg.types.json import Json

    return Json(value)


def alembic_config(url: str) -> AlembicConfig:
    from alembic.config import Config as AlembicConfig

    config = AlembicConfig()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", normalise_url(url).replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Apply migrations up to `revision` (idempotent); serialised by an advisory lock.

    A database already at the head returns at once, without importing Alembic (every command calls
    this; `metarl status` should answer fast).
    """
    if revision == "head":
        head = head_revision()
        if head is not None and current_revision(url) == head:
            return
    from alembic import command

    engine = get_engine(url)
    with engine.begin() as connection:
        connection.execute(text("SELECT pg_advisory_xact_lock(874221)"))
        config = alembic_config(url)
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def current_revision(url: str) -> str | None:
    with get_engine(url).connect() as connection:
        exists = connection.execute(text("SELECT to_regclass('alembic_version')")).scalar()
        if exists is None:
            return None
        return connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
