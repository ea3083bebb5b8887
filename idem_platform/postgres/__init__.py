"""PostgreSQL: where the URL comes from, the ``idem`` schema's versioned DDL, and the record tables."""

from idem_platform.postgres.connection import connect, is_unix_socket_url
from idem_platform.postgres.embedded import embedded_postgres_url, resolve_postgres_url
from idem_platform.postgres.schema import SCHEMA, STAGING_SCHEMA, ensure_schema
from idem_platform.settings import POSTGRES_URL_ENV

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
