"""PassContext: the one options object shared by the CLI and Python (pipeline, toggles, instruments).

Toggles use the pass names everywhere:
* `disabled`  names removed from the pipeline (also `DSPARK_DISABLE_PASSES=a,b` in the environment,
              unless `use_env=False`). Disabling a pass that is not in the pipeline does nothing.
* `enabled`   `name` or `name{opts}`: turns on an entry that is off by default at its place, re-enables a
              pass disabled by the environment, or appends the pass when the pipeline lacks it.
              Enabling and disabling the same name explicitly is an error.
* `only`      keep only these passes (in pipeline order; names the pipeline lacks are appended).
* `options`   {name: {option: value}} applied to every entry of that pass (values typed or as text).
Order: enable, only, disable, options. The effective pipeline prints in every dump header and is part of
the cache key (`PassContext.cache_key()`).

Use it as `with PassContext(disabled=["cse"], check_numerics=True): run_pipeline(g)`; the innermost
active context is `PassContext.current()`; a nested context replaces the outer one (no merging).
"""
from __future__ import annotations

import contextvars
import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence, TextIO

from . import defaults
from .errors import PipelineError
from .options import option_specs
from .pipeline import Pipeline, build, parse_entries, parse_pipeline, typed_option
from .registry import get_pass

ENV_DISABLE = "DSPARK_DISABLE_PASSES"
ENV_NUMERICS = "DSPARK_CHECK_NUMERICS"
ENV_ROUNDTRIP = "DSPARK_ROUNDTRIP_EACH"
REPRO_TEMP = "<new temporary directory>"   # `repro`: write DIR/repro.dsir in a new temp DIR (never over a file)

_CURRENT: contextvars.ContextVar["PassContext | None"] = contextvars.ContextVar("dspark_pass_context", default=None)
_TOKENS: list[contextvars.Token] = []


@dataclass(frozen=True)
class Slot:
    """One pipeline entry after toggles: the configured pass, whether it runs, and why."""

    pass_: Any
    on: bool
    why: str = ""
    note: str = ""


@dataclass(frozen=True)
class PassContext:
    # ---- the pipeline and its toggles
    pipeline: str | Pipeline | None = None      # None: the default pipeline (passes.infra.defaults)
    disabled: Sequence[str] = ()
    enabled: Sequence[Any] = ()                  # "name", "name{opts}" or Pass instances
    only: Sequence[str] = ()
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    use_env: bool = True
    # ---- checks
    verify_each: bool = True
    roundtrip_each: bool | None = None           # None: $DSPARK_ROUNDTRIP_EACH
    check_numerics: bool | None = None           # None: $DSPARK_CHECK_NUMERICS
    seed: int = 0
    # ---- reports (to `stdout`/`stderr`, default sys.stdout/sys.stderr)
    time_passes: bool = False
    print_ir_after_all: bool = False
    print_ir_after: Sequence[str] = ()
    print_ir_before: Sequence[str] = ()
    print_ir_after_change: bool = False
    pass_stats: bool = False
    explain: Sequence[str] = ()
    # ---- bisection
    bisect_limit: int | None = None
    bisect_rewrites: bool = False
    # ---- artefacts
    dump_dir: str | None = None
    dump: str = "all"                            # all | changed
    dump_dot: bool = False
    dump_svg: bool = False
    repro: str | None = None                     # reproducer path, or REPRO_TEMP; None: <dump_dir>/repro.dsir
                                                 # if dumping, else none written
    # ---- provenance (dump headers, reproducer commands)
    source: str = ""                             # e.g. "model.dsir" or "decode-swa --config tiny"
    plugins: Sequence[str] = ()                  # modules that register extra passes
    origin: str = "PassContext"                  # "cli": toggle errors are located at the flag
    stdout: TextIO | None = None
    stderr: TextIO | None = None

    def __post_init__(self):
        for name in ("print_ir_after", "print_ir_before", "explain", "plugins"):
            value = getattr(self, name)
            items = value.split(",") if isinstance(value, str) else value
            object.__setattr__(self, name, tuple(i.strip() for i in items if i.strip()))
        for name in ("disabled", "only"):  # items may be comma lists; _names() splits them with columns
            value = getattr(self, name)
            object.__setattr__(self, name, (value,) if isinstance(value, str) else tuple(value))
        enabled = (self.enabled,) if isinstance(self.enabled, str) else tuple(self.enabled)
        object.__setattr__(self, "enabled", enabled)
        if self.dump not in ("all", "changed"):
            raise PipelineError(f"dump mode must be 'all' or 'changed', got '{self.dump}'", self._flag("dump"))
        if self.bisect_limit is not None and self.bisect_limit < 0:
            raise PipelineError("the bisect limit must be >= 0", self._flag("bisect_limit"))

    # ---- activation -------------------------------------------------------------------------------
    def __enter__(self) -> "PassContext":
        _TOKENS.append(_CURRENT.set(self))
        return self

    def __exit__(self, *exc) -> None:
        _CURRENT.reset(_TOKENS.pop())

    @staticmethod
    def current() -> "PassContext":
        return _CURRENT.get() or PassContext()

    def replace(self, **changes: Any) -> "PassContext":
        return dataclasses.replace(self, **changes)

    # ---- resolved settings ------------------------------------------------------------------------
    @property
    def numerics_on(self) -> bool:
        return self.check_numerics if self.check_numerics is not None else _env_flag(ENV_NUMERICS)

    @property
    def roundtrip_on(self) -> bool:
        return self.roundtrip_each if self.roundtrip_each is not None else _env_flag(ENV_ROUNDTRIP)

    @property
    def repro_path(self) -> str | None:
        if self.repro:
            return self.repro
        return os.path.join(self.dump_dir, "repro.dsir") if self.dump_dir else None

    def check_report_names(self) -> None:
        """--print-ir-after and --explain name registered passes (a typo would silently print nothing)."""
        self._names(self.print_ir_after, self._flag("print_ir_after"))
        self._names(self.print_ir_before, self._flag("print_ir_before"))
        self._names(self.explain, self._flag("explain"))

    def cache_key(self, pipeline: str | Pipeline | None = None) -> str:
        return self.effective_pipeline(pipeline).key

    # ---- the effective pipeline -------------------------------------------------------------------
    def effective_pipeline(self, pipeline: str | Pipeline | None = None) -> Pipeline:
        return Pipeline(tuple(s.pass_ for s in self.slots(pipeline) if s.on))

    def slots(self, pipeline: str | Pipeline | None = None) -> list[Slot]:
        """Every entry of the base pipeline with toggles applied (off entries kept, with a note)."""
        slots = self._base(self.pipeline if pipeline is None else pipeline)
        slots = self._apply_enabled(slots)
        slots = self._apply_only(slots)
        slots = self._apply_disabled(slots)
        return self._apply_options(slots)

    def _base(self, base: str | Pipeline | None) -> list[Slot]:
        if base is None:
            return [Slot(build(parse_entries(e.spec, "default pipeline")[0], "default pipeline"), e.enabled, e.why,
                         "" if e.enabled else "off by default (--enable to run it)") for e in defaults.DEFAULT_PIPELINE]
        passes = base if isinstance(base, Pipeline) else parse_pipeline(base)
        return [Slot(p, True, p.summary()) for p in passes]

    def _apply_enabled(self, slots: list[Slot]) -> list[Slot]:
        for spec in self.enabled:
            p, explicit = self._enabled_pass(spec)
            hits = [i for i, s in enumerate(slots) if s.pass_.name == p.name]
            for i in hits:
                slots[i] = Slot(p if explicit else slots[i].pass_, True, slots[i].why, f"on: {self._flag('enabled')}")
            if not hits:
                slots.append(Slot(p, True, p.summary(), f"added by {self._flag('enabled')}"))
        return slots

    def _enabled_pass(self, spec: Any) -> tuple[Any, bool]:
        if not isinstance(spec, str):
            return spec, True
        entries = parse_entries(spec, self._flag("enabled"))
        if len(entries) != 1:
            raise PipelineError(f"give one pass per {self._flag('enabled')}", f"{self._flag('enabled')}:1:1")
        return build(entries[0], self._flag("enabled")), bool(entries[0].options)

    def _apply_only(self, slots: list[Slot]) -> list[Slot]:
        if not self.only:
            return slots
        names = self._names(self.only, self._flag("only"))
        kept = [Slot(s.pass_, s.pass_.name in names, s.why, s.note if s.pass_.name in names
                     else f"off: not in {self._flag('only')}") for s in slots]
        present = {s.pass_.name for s in slots}
        for name in names:
            if name not in present:
                cls = get_pass(name)
                kept.append(Slot(cls(), True, cls.summary(), f"added by {self._flag('only')}"))
        return kept

    def _apply_disabled(self, slots: list[Slot]) -> list[Slot]:
        explicit = self._names(self.disabled, self._flag("disabled"))
        enabled = {self._enabled_pass(e)[0].name for e in self.enabled}
        both = sorted(set(explicit) & enabled)
        if both:
            raise PipelineError(f"pass '{both[0]}' is both enabled and disabled", self._flag("disabled"))
        env = self._names(os.environ.get(ENV_DISABLE, ""), ENV_DISABLE) if self.use_env else []
        off = {n: f"off: {self._flag('disabled')}" for n in explicit}
        off.update({n: f"off: {ENV_DISABLE}" for n in env if n not in enabled and n not in off})
        return [Slot(s.pass_, False, s.why, off[s.pass_.name]) if s.pass_.name in off else s for s in slots]

    def _apply_options(self, slots: list[Slot]) -> list[Slot]:
        where = self._flag("options")
        for name, opts in self.options.items():
            cls = _located(lambda: get_pass(name), where)
            specs = option_specs(cls)
            typed = {k: typed_option(cls, specs, k, v, where) for k, v in opts.items()}
            slots = [Slot(dataclasses.replace(s.pass_, **typed), s.on, s.why, s.note) if s.pass_.name == name else s
                     for s in slots]
        return slots

    def _names(self, items: Sequence[str] | str, source: str) -> list[str]:
        """Pass names from a list (or a comma string), each checked against the registry."""
        texts = [items] if isinstance(items, str) else list(items)
        names = []
        for text in texts:
            for e in parse_entries(text, source):
                if e.options:
                    raise PipelineError(f"'{e.name}': only pass names here, no options", f"{source}:1:{e.col}")
                _located(lambda: get_pass(e.name), f"{source}:1:{e.col}")
                names.append(e.name)
        return names

    def _flag(self, field_name: str) -> str:
        if self.origin == "cli":
            return {"enabled": "--enable", "disabled": "--disable", "only": "--only",
                    "options": "--pass-option"}.get(field_name, f"--{field_name.replace('_', '-')}")
        return f"PassContext({field_name})"

    # ---- provenance (every output's record of what ran) ----------------------------------------------
    def environment(self) -> dict[str, str]:
        """The environment variables that changed this context's pipeline: {DSPARK_DISABLE_PASSES: value} when
        it is set and honoured (use_env), else {}."""
        value = os.environ.get(ENV_DISABLE, "").strip()
        return {ENV_DISABLE: value} if self.use_env and value else {}

    def provenance(self, pipeline: str | Pipeline | None = None) -> dict[str, Any]:
        """The pass side of an output's provenance record: the effective pipeline and its key, and the toggles
        that made it, from arguments and from the environment."""
        effective = self.effective_pipeline(pipeline)
        base = self.pipeline if pipeline is None else pipeline
        return {"pipeline": str(effective), "pipeline_key": effective.key,
                "base": "default" if base is None else str(base),
                "enabled": [str(e) for e in self.enabled], "disabled": list(self.disabled), "only": list(self.only),
                "options": {name: {k: str(v) for k, v in opts.items()} for name, opts in self.options.items()},
                "environment": self.environment(), "plugins": list(self.plugins)}

    # ---- the pipeline table (dspark opt --print-pipeline) -------------------------------------------
    def describe_pipeline(self, pipeline: str | Pipeline | None = None) -> str:
        slots = self.slots(pipeline)
        effective = Pipeline(tuple(s.pass_ for s in slots if s.on))
        lines = [f"# effective pipeline (cache key {effective.key}):", f"#   {effective}"]
        width = max([len(str(s.pass_)) for s in slots] + [12]) + 4
        for s in slots:
            text = str(s.pass_) if s.on else f"# {s.pass_}"
            note = f"[{s.note}] " if s.note else ""
            lines.append(f"{text:<{width}}# {note}{s.why}".rstrip())
        return "\n".join(lines) + "\n"


def _located(fn, where: str):
    try:
        return fn()
    except PipelineError as e:
        raise e.at(where) from None


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
