"""The options every ``idem`` command shares, and the argument checks that are one-line errors.

``--config`` and ``-v/--verbose`` are accepted before the command (``idem --config F
rejects``) and after it (``idem rejects --config F``): :class:`IdemCommand` and
:class:`IdemGroup` give them to every command and group, and their values meet in one
:class:`Invocation` (Click hands a context's ``obj`` down to its subcommands). A flag
given at any level stays set; a ``--config`` given later wins.

Bad values of ``--commit`` and ``--limit`` are ``idem: error:`` lines with exit status 1,
as before the move to Click (not Click's usage text and exit status 2): scripts and
tests read that line.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from idem_platform.cli.output import CommandError
from idem_platform.config import CONFIG_ENV

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Invocation:
    """What the shared options said, wherever on the command line they were given.

    ``json``: ``None`` while no command with ``--json`` ran (its report is then always JSON).
    """

    config: str | None = None
    verbose: bool = False
    json: bool | None = None


def _remember(field: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    """A callback that stores a shared option's value in the :class:`Invocation`: a value
    given overrides, a flag left out keeps what an outer level set."""

    def store(ctx: click.Context, _param: click.Parameter, value: Any) -> None:
        invocation = ctx.ensure_object(Invocation)
        if isinstance(value, bool):
            setattr(invocation, field, value or bool(getattr(invocation, field)))
        elif value is not None:
            setattr(invocation, field, value)

    return store


def _shared_params() -> list[click.Parameter]:
    """``--config`` and ``-v/--verbose``, as every command and group takes them."""
    return [
        click.Option(
            ["--config"], metavar="PATH", expose_value=False, callback=_remember("config"),
            help=f"idem.yaml (default: ${CONFIG_ENV}, else ./idem.yaml)",
        ),
        click.Option(
            ["-v", "--verbose"], is_flag=True, expose_value=False, callback=_remember("verbose"),
            help="on failure, print the traceback to stderr too (the last line is still the one-line error)",
        ),
    ]


class IdemCommand(click.Command):
    """A command with the shared options."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.extend(_shared_params())


class IdemGroup(click.Group):
    """A group with the shared options, whose commands and subgroups have them too."""

    command_class = IdemCommand
    group_class = type  # subgroups are IdemGroups as well

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.extend(_shared_params())


def json_option(help_text: str = "one JSON line even on a terminal") -> Callable[[F], F]:
    """``--json``: JSON even on a terminal (stored in the :class:`Invocation`)."""
    return click.option("--json", is_flag=True, expose_value=False, callback=_remember("json"), help=help_text)


def invocation() -> Invocation:
    """The current command line's :class:`Invocation`."""
    return click.get_current_context().ensure_object(Invocation)


class CommitId(click.ParamType):
    """``--commit``: a commit id (a UUID), normalised; else a one-line error."""

    name = "ID"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            return str(uuid.UUID(str(value)))
        except ValueError:
            raise CommandError(f"--commit {value!r} is not a commit id (a UUID)") from None


class AtLeastOne(click.ParamType):
    """A count that must be at least 1 (``--limit``, ``--batch-rows``); else a one-line error."""

    name = "N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            number = value
        else:
            try:
                number = int(value)
            except ValueError:
                self.fail(f"{value!r} is not a whole number", param, ctx)
        if number < 1:
            name = param.opts[0] if param is not None and param.opts else "N"
            raise CommandError(f"{name} must be at least 1 (got {number})")
        return number


COMMIT_ID = CommitId()
AT_LEAST_ONE = AtLeastOne()
