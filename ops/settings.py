"""Settings declared once, as dataclass fields; their flags, env vars and TOML keys derived.

A field is a setting when its metadata has a "help":

    max_batch_tokens: int = field(default=8192, metadata={"help": "Bucket flush: tokens."})

is `--max-batch-tokens`, `TOKENMILL_MAX_BATCH_TOKENS` and the TOML key `max_batch_tokens`,
with the field's type and default. The metadata is plain data, so `actors/` and `gpu/` declare
their settings without importing this module. Its other keys:

- "old": a former name (or a tuple of them), still read as flag, env var and TOML key
  (deprecated; docs/cli.md lists them);
- "name": the setting's name where it cannot be the field's (a clash with another option);
- "short": a one-letter flag (`-m`);
- "choices": the values it may take;
- "file": True where the value is the path of a file that must exist;
- "cli": the command line's default where it is not the library's (a worker started from
  the CLI serves HTTP; a library user opts in);
- "off": a command-line value that means None (`--http-port -1`).

An optional field given "" on the command line is None. A field with `repr=False` is a
secret: `--help` shows `(set)`, never its value. A dataclass-typed field whose metadata has
"parts" or "prefix" holds nested settings, named prefix (default: the field's name and `_`)
+ their own field's name; declared in the nested class's metadata, or where that class
declares none, in "parts" ({field: metadata}) of the outer field's.
A field without a help is not a setting (the library's alone). A command line leaves a
field out when it has no value for it, so the dataclass's default (or factory) applies.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
ENV_PREFIX = "TOKENMILL_"


class SecretOption(click.Option):
    """An option whose value is a secret. `--help` shows `(set)` where another option shows
    its default, when a default, the worker's TOML file or the env var gives one; never the
    value. A field declared with `repr=False` gets this class."""

    def get_help_extra(self, ctx: click.Context) -> click.types.OptionHelpExtra:
        extra = super().get_help_extra(ctx)
        extra.pop("default", None)
        if self.get_default(ctx, call=False) or self.resolve_envvar_value(ctx):
            extra["default"] = "(set)"
        return extra


class Items(click.ParamType[tuple[Any, ...]]):
    """Comma-separated values (`32,64`), or a TOML list, as a tuple of `item`."""

    name = "list"

    def __init__(self, item: type) -> None:
        self.item = item

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple | list):
            parts = list(value)
        else:
            parts = [p.strip() for p in str(value).split(",") if p.strip()]
        try:
            return tuple(self.item(p) for p in parts)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting of a dataclass, as the command line sees it."""

    name: str  # the flag's, the env var's and the TOML key's, with underscores
    field: dataclasses.Field[Any]
    meta: Mapping[str, Any]  # the declaration: "help", "old", ...
    kind: Any  # the field's type, None taken out
    optional: bool  # None is one of its values
    default: Any  # the command line's

    @property
    def old(self) -> tuple[str, ...]:
        old = self.meta.get("old", ())
        return (old,) if isinstance(old, str) else tuple(old)

    @property
    def has_default(self) -> bool:
        f = self.field
        return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING

    def option(self, envvars: bool, required: bool) -> Callable[[F], F]:
        names = (self.name, *self.old)
        dash = [n.replace("_", "-") for n in names]
        flag = "--{0}/--no-{0}" if self.kind is bool else "--{0}"
        decls = [flag.format(d) for d in dash]
        decls += [*([self.meta["short"]] if "short" in self.meta else []), self.name]
        default = self.default
        if isinstance(default, tuple):
            default = ",".join(map(str, default))
        extra: dict[str, Any] = {}
        if envvars:
            env = [ENV_PREFIX + n.upper() for n in names]
            extra = {"envvar": env if self.old else env[0], "show_envvar": True}
        if required and default is None and not self.has_default:
            extra["required"] = True  # (click takes an explicit default=None for a value)
        else:
            extra["default"] = default
        return click.option(
            *decls,
            type=_click_type(self),
            show_default=True,
            help=self.meta["help"],
            cls=click.Option if self.field.repr else SecretOption,
            **extra,
        )

    def value(self, given: Any) -> Any:
        """The field's value from the command line's (None: the dataclass decides)."""
        if self.optional and (given == "" or ("off" in self.meta and given == self.meta["off"])):
            return None
        return given


def _click_type(s: Setting) -> Any:
    if s.meta.get("file"):
        return click.Path(exists=True, dir_okay=False)
    if "choices" in s.meta:
        return click.Choice(s.meta["choices"], case_sensitive=False)
    if typing.get_origin(s.kind) is tuple:
        return Items(typing.get_args(s.kind)[0])
    return None if s.kind is bool else s.kind


@dataclasses.dataclass(frozen=True)
class _Level:
    """The settings of one dataclass, and of those nested in it by field."""

    cls: type
    own: tuple[Setting, ...]
    nested: tuple[tuple[str, _Level], ...]

    def all(self) -> Iterator[Setting]:
        yield from self.own
        for _, level in self.nested:
            yield from level.all()

    def make(self, values: dict[str, Any], given: Mapping[str, Any]) -> Any:
        kwargs = dict(given)
        for s in self.own:
            value = s.value(values.pop(s.name))
            if value is not None or s.optional:
                kwargs[s.field.name] = value
        for name, level in self.nested:
            kwargs[name] = level.make(values, {})
        return self.cls(**kwargs)


def _level(cls: type, prefix: str = "", parts: Mapping[str, Any] | None = None) -> _Level:
    hints = typing.get_type_hints(cls)
    defaults = cls() if parts is not None else None  # the nested class's own defaults
    own: list[Setting] = []
    nested: list[tuple[str, _Level]] = []
    for f in dataclasses.fields(cls):
        kind, optional = _unwrap(hints[f.name])
        if "prefix" in f.metadata or "parts" in f.metadata:
            inner = f.metadata.get("prefix", f.name + "_")
            nested.append((f.name, _level(kind, prefix + inner, f.metadata.get("parts"))))
            continue
        meta = parts.get(f.name, {}) if parts is not None else f.metadata
        if "help" not in meta:
            continue
        if "cli" in meta:
            default = meta["cli"]
        elif defaults is not None:
            default = getattr(defaults, f.name)
        else:
            default = None if f.default is dataclasses.MISSING else f.default
        own.append(Setting(prefix + meta.get("name", f.name), f, meta, kind, optional, default))
    return _Level(cls, tuple(own), tuple(nested))


def _unwrap(hint: Any) -> tuple[Any, bool]:
    if isinstance(hint, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(hint))
    return hint, False


def settings(cls: type) -> list[Setting]:
    """Every setting `cls` declares, nested ones included, in field order."""
    return list(_level(cls).all())


def options(cls: type, *, envvars: bool = True, required: bool = True) -> Callable[[F], F]:
    """A decorator adding an option per setting of `cls` to a click command; each also read
    from its `TOKENMILL_*` env var unless `envvars` is False. A field with no default is a
    required option unless `required` is False."""

    def add(command: F) -> F:
        for s in reversed(settings(cls)):
            command = s.option(envvars, required)(command)
        return command

    return add


def build(cls: type[T], values: dict[str, Any], **given: Any) -> T:
    """`cls` from a command's option values: its settings are popped out of `values`;
    `given` sets fields outright. A value `cls` refuses is a usage error."""
    try:
        made: T = _level(cls).make(values, given)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    return made


def config_file_option(table: str) -> Callable[[F], F]:
    """`--config FILE.toml` (`TOKENMILL_CONFIG`): defaults for the command's options, by
    their names (a former name, or dashes for underscores, are read too), at the top level or
    under `[table]`. A flag or env var still wins over the file."""

    def load(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
        if not value:
            return
        try:
            data = tomllib.loads(Path(value).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise click.BadParameter(f"cannot read {value}: {exc}") from exc
        names = {
            opt.lstrip("-").replace("-", "_"): param.name
            for param in ctx.command.params
            for opt in param.opts
            if opt.startswith("--") and param.name
        }
        values = {}
        for key, item in data.get(table, data).items():
            key = key.replace("-", "_")
            values[names.get(key, key)] = item
        ctx.default_map = {**(ctx.default_map or {}), **values}

    return click.option(
        "--config",
        type=click.Path(exists=True, dir_okay=False),
        envvar=ENV_PREFIX + "CONFIG",
        is_eager=True,
        expose_value=False,
        callback=load,
        help=f"TOML file with any of these settings (env {ENV_PREFIX}CONFIG).",
    )
