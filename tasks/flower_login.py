"""Whether Flower's command line and environment configure a real login.

``flowerconfig.py`` refuses to start Flower open. Flower 2.2 takes each option from
``FLOWER_<NAME>`` and from argv, where tornado reads ``--name=value`` with any number of
leading dashes and ``_`` or ``-`` alike, the last one winning over the environment. A
login is either basic auth whose every ``user:password`` has both parts, or OAuth with
its e-mail pattern (``auth``), the provider's key, secret and redirect URI; anything
else (``--auth=`` empty, ``--auth_provider`` alone, ``--basic-auth=u:``) leaves it open.
"""
from __future__ import annotations

from typing import Mapping, Sequence

#: Flower's options that make a login, by tornado's normalised name.
BASIC = "basic-auth"
OAUTH = ("auth", "oauth2-key", "oauth2-secret", "oauth2-redirect-uri")


def _normalised(name: str) -> str:
    return name.replace("_", "-")


def flower_args(argv: Sequence[str]) -> list[str]:
    """The arguments after the ``flower`` sub-command (all of ``argv`` without one)."""
    args = list(argv)
    return args[args.index("flower") + 1:] if "flower" in args else args[1:]


def given(argv: Sequence[str], env: Mapping[str, str]) -> dict[str, str]:
    """The login options Flower will use: argv's last ``--name=value`` or ``--name value``
    over ``FLOWER_NAME`` from ``env``."""
    values = {name: env.get("FLOWER_" + name.replace("-", "_").upper(), "")
              for name in (BASIC, *OAUTH)}
    args = flower_args(argv)
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if not arg.startswith("-"):
            continue
        name, equals, value = arg.lstrip("-").partition("=")
        if not equals:  # ``--name value``: tornado itself refuses it, but never open
            after = args[i + 1] if i + 1 < len(args) else ""
            value = "" if after.startswith("-") else after
        if _normalised(name) in values:
            values[_normalised(name)] = value
    return values


def _basic_problem(value: str) -> str | None:
    """What is wrong with basic-auth logins ``value`` (comma-separated), or None."""
    for login in value.split(","):
        user, _, password = login.strip().partition(":")
        if not user or not password:
            return (f"basic auth needs user:password with both parts, got {login.strip()!r}"
                    " (FLOWER_BASIC_AUTH or --basic-auth)")
    return None


def login_problem(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """Why Flower started with ``argv`` and ``env`` would be open, or None if it asks for
    a login."""
    values = given(argv, env)
    if values[BASIC].strip():
        return _basic_problem(values[BASIC])
    missing = [name for name in OAUTH if not values[name].strip()]
    if not missing:
        return None
    if len(missing) == len(OAUTH):
        return ("no login configured: set FLOWER_BASIC_AUTH=user:password, or OAuth "
                "(FLOWER_AUTH with FLOWER_OAUTH2_KEY, FLOWER_OAUTH2_SECRET and "
                "FLOWER_OAUTH2_REDIRECT_URI)")
    names = ", ".join("FLOWER_" + name.replace("-", "_").upper() for name in missing)
    return f"OAuth is incomplete: {names} missing or empty (or their --options)"


def refuse_open_flower() -> None:
    """Exit unless a ``celery -A tasks flower`` being started now asks for a login: run as
    the command loads the app, so no folder it runs from and no ``--conf`` escapes it.
    The login must be in the environment or on the command line."""
    import os
    import sys

    import click

    context = click.get_current_context(silent=True)
    if context is None or context.invoked_subcommand != "flower":
        return
    if problem := login_problem(sys.argv, os.environ):
        raise SystemExit(f"gpulanes: Flower will not start without authentication: {problem}")
