"""PostgreSQL: where the URL comes from, the ``idem`` schema's versioned DDL, and the record tables."""

from idem_platform.postgres.connection import (
    POSTGRES_URL_ENV,
    connect,
    embedded_postgres_url,
    is_unix_socket_url,
    resolve_postgres_url,
)
from idem_platform.postgres.schema import SCHEMA, STAGING_SCHEMA, ensure_schema

__all__ = [
    "POSTGRES_URL_ENV",
    "SCHEMA",
    "STAGING_SCHEMA",
    "connect",
    "embedded_postgres_url",
    "ensure_schema",
    "is_unix_socket_url",
    "resolve_postgres_url",
]
