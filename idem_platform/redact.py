"""Keeping credentials out of everything a person or a log reads.

A PostgreSQL URL carries its password (``postgresql://idem:secret@db/idem``),
and a Kafka connector's ``client_config`` its SASL and TLS secrets. idem prints
summaries, one-line errors, tracebacks and log files, and Dagster stores run
logs, metadata and job snapshots: none of them may show a secret.

Two tools, because a secret reaches text in two ways:

* :func:`masked` / :func:`masked_settings` for values idem shows on purpose (the
  URL in ``idem demo``'s summary): the password becomes ``***``, the rest stays
  readable.
* :func:`scrub` for text idem does not write itself: an exception's message
  (libpq echoes a whole URL it cannot parse, password included), a traceback.
  It replaces every secret this process has seen (:func:`remember_url`,
  :func:`remember_settings`) wherever it occurs. Secrets are remembered where they
  enter the process (the environment, the config file, a resource), so every
  later message can be scrubbed without knowing where its text came from.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from urllib.parse import unquote

from idem_platform.errors import IdemError

MASK = "***"

# scheme://user:password@ — by regex, not urlsplit: a URL malformed enough to fail
# (an unclosed IPv6 bracket) is exactly the one libpq echoes back in full.
_URL_PASSWORD = re.compile(r"(?P<head>^[A-Za-z][A-Za-z0-9+.-]*://[^/@:]*:)(?P<secret>[^/@]*)(?=@)")
# ...?password=secret&... in a URL's query string.
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&]password=)(?P<secret>[^&#]*)", re.IGNORECASE)
# password=secret or password='se cret' in a libpq key=value string.
_DSN_PASSWORD = re.compile(r"(?P<head>(?:^|\s)password\s*=\s*)(?P<secret>'(?:[^'\\]|\\.)*'|[^\s']\S*)", re.IGNORECASE)
# ;token=secret in a Spark Connect URL (sc://localhost:15002/;token=...;session_id=...).
_CONNECT_TOKEN = re.compile(r"(?P<head>;token=)(?P<secret>[^;]*)", re.IGNORECASE)
_URL_PATTERNS = (_URL_PASSWORD, _QUERY_PASSWORD, _DSN_PASSWORD, _CONNECT_TOKEN)

# librdkafka settings whose values are credentials (sasl.password, ssl.key.password,
# ssl.keystore.password, sasl.oauthbearer.client.secret, ssl.key.pem, a bearer config).
_SECRET_SETTING = re.compile(r"password|secret|token|credential|\.pem$|oauthbearer\.config|jaas", re.IGNORECASE)

_known: set[str] = set()


def masked(url: str) -> str:
    """A PostgreSQL URL (or libpq key=value string) fit for people and logs: its password is ``***``."""
    for pattern in _URL_PATTERNS:
        url = pattern.sub(lambda m: m.group("head") + MASK, url)
    return url


def url_secrets(url: str) -> set[str]:
    """The passwords a URL or key=value string carries, as written and percent-decoded."""
    found: set[str] = set()
    for pattern in _URL_PATTERNS:
        for match in pattern.finditer(url):
            secret = match.group("secret")
            if len(secret) > 1 and secret[0] == secret[-1] == "'":
                secret = secret[1:-1]
            found |= {secret, unquote(secret)}
    return {s for s in found if s}


def is_secret_setting(key: str) -> bool:
    """Whether a client setting's value is a credential (by its name)."""
    return _SECRET_SETTING.search(key) is not None


def masked_settings(settings: Mapping[str, str]) -> dict[str, str]:
    """Client settings fit for people and logs: credential values are ``***``."""
    return {key: MASK if is_secret_setting(key) else value for key, value in settings.items()}


def remember_url(url: str | None) -> None:
    """Scrub this URL's password from every later message of this process."""
    if url:
        _known.update(url_secrets(url))


def remember_settings(settings: Mapping[str, str]) -> None:
    """Scrub these settings' credential values from every later message of this process."""
    _known.update(str(v) for k, v in settings.items() if is_secret_setting(k) and str(v))


def remember_secrets(values: Iterable[str]) -> None:
    """Scrub these values (secrets a config took from the environment) from every later message."""
    _known.update(v for v in values if v)


def scrub(text: str) -> str:
    """``text`` with every remembered secret replaced by ``***``.

    The longest secrets go first, so one that contains another is replaced whole.
    """
    for secret in sorted(_known, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def mentions_secret(text: str) -> bool:
    """Whether ``text`` holds a remembered secret."""
    return any(secret in text for secret in _known)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception it was raised from or during (what a traceback prints)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)


def scrubbed(exc: BaseException) -> BaseException | None:
    """A copy of ``exc`` safe to show, or ``None`` when neither it nor its chain holds a secret.

    The copy keeps the class where it can (an :class:`~idem_platform.errors.IdemError`
    keeps its kind, so retry decisions stay the same), carries the scrubbed message,
    and drops the chain: the causes are where the secret was.
    """
    if not any(mentions_secret(f"{type(e).__name__}: {e}") for e in _chain(exc)):
        return None

    message = scrub(str(exc))
    if isinstance(exc, IdemError):
        return IdemError.from_json({**exc.to_json(), "message": message})
    try:
        copy = type(exc)(message)
        if str(copy) == message:
            return copy
    except Exception:  # noqa: BLE001, S110 - a class that wants other arguments: fall back below
        pass
    return RuntimeError(f"{type(exc).__name__}: {message}")


@contextmanager
def secrets_kept() -> Iterator[None]:
    """Re-raise an exception that would show a secret as its scrubbed copy (from ``None``).

    Wrapped around code whose failures Dagster records (resource setup, asset bodies,
    IO managers): Dagster stores the message and the cause chain of whatever escapes.
    """
    try:
        yield
    except Exception as exc:
        safe = scrubbed(exc)
        if safe is None:
            raise
        raise safe from None
