"""Column lists of the statements written as SQL text, taken from the records (`metarl.store.records`), not typed again.

A statement sent as written (:func:`metarl.store.db.run_sql`) names its columns in its text; these
helpers build those names from the tables' own columns, so a column renamed or added in the records
changes every statement that lists it, and a name that is not a column fails at import.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from sqlalchemy import FromClause


def table_name(table: FromClause) -> str:
    """The name of a record's table (`Model.__table__`, typed as a FromClause by SQLAlchemy)."""
    name = getattr(table, "name", None)
    if not isinstance(name, str):
        raise TypeError(f"{table!r} is not a named table")
    return name


def checked_columns(table: FromClause, names: Iterable[str]) -> tuple[str, ...]:
    """`names`, each a column of `table` (raises ValueError naming the ones that are not)."""
    names = tuple(names)
    unknown = [name for name in names if name not in table.c]
    if unknown:
        raise ValueError(f"{table_name(table)} has no column {', '.join(unknown)} (see metarl/store/records.py)")
    return names


def columns_of(table: FromClause, *, without: Collection[str] = ()) -> tuple[str, ...]:
    """The columns of `table` in the records' order, less `without` (each of which must be a column)."""
    checked_columns(table, without)
    return tuple(column.name for column in table.c if column.name not in without)


def insert_lists(table: FromClause, columns: Iterable[str], values: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The column list and the value list of an insert of `columns` (checked against `table`).

    Each column's value is the parameter of its name (`%(name)s`) unless `values` gives its SQL
    (`now()`, a constant); a column of `values` must be one of `columns`.
    """
    names = checked_columns(table, columns)
    given = dict(values or {})
    extra = sorted(set(given) - set(names))
    if extra:
        raise ValueError(f"values for columns not inserted into {table_name(table)}: {', '.join(extra)}")
    return ", ".join(names), ", ".join(given.get(name, f"%({name})s") for name in names)


def assignments(table: FromClause, columns: Iterable[str], values: Mapping[str, str] | None = None) -> str:
    """`column = %(column)s, ...` for an UPDATE's SET (checked against `table`; `values` as in :func:`insert_lists`)."""
    names = checked_columns(table, columns)
    given = dict(values or {})
    extra = sorted(set(given) - set(names))
    if extra:
        raise ValueError(f"values for columns not set in {table_name(table)}: {', '.join(extra)}")
    return ", ".join(f"{name} = {given.get(name, f'%({name})s')}" for name in names)
