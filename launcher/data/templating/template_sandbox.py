"""The Jinja environment chat templates render in, and the guard that keeps one inside its budget.

The environment is what Hugging Face transformers 4.4x-5.x render with
(``utils/chat_template_utils.py``, re-stated here so that llmtrain never imports transformers):
a Jinja2 ``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and ``lstrip_blocks``, the
``loopcontrols`` extension and a ``{% generation %}`` block tag (rendered as its body); the
``tojson`` filter is ``json.dumps`` without ASCII escaping (keyword arguments ``indent``,
``separators``, ``sort_keys``); the globals ``raise_exception`` (a template error),
``strftime_now`` (the local time formatted), ``dict`` and ``namespace`` (which refuses
underscore-prefixed names).

Jinja's sandbox keeps a template away from Python's internals; it does not stop one from running
forever or filling memory (``{% for i in range(100000) %}{% for j in range(100000) %}``,
``{{ 'x' * 4000000000 }}``, ``{{ '%0999999999d' % 1 }}``). The guard here does, inside the
process, with the template line where it stopped (``TemplateBudgetError``), under the budget of
the conversation being rendered (``watching``, ``launcher.data.limits``):

- time: a deadline, checked at every item of every ``{% for %}`` (each loop iterates through a
  guard the parser puts there) and at every call and filter: whatever runs between two checks is
  a stretch of the template's own text, bounded by its length;
- size: ``*``, ``+``, ``%`` and ``**`` refuse a result over the output budget before making it,
  as do ``center``/``ljust``/``rjust``/``zfill``/``replace``/``expandtabs``, ``str.format``
  widths, the ``center``/``indent``/``format``/``replace``/``batch``/``slice`` filters,
  ``tojson``'s indent and ``lipsum``; every call's, filter's and ``~``'s result is measured (so
  no value the template stores, in a variable or a namespace, is over the budget); the rendered
  text is counted as it streams out.

What the guard cannot see (one C-level operation on a huge value: ``str.join`` of a million long
strings) the template worker catches from outside (``templating.template_worker``: a child
process with an address-space limit, killed when a conversation overruns its time).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from functools import cache
from typing import Any

from launcher.data.limits import DataLimits
from launcher.errors import UserError

_LOOP_FILTER = "llmtrain_loop_guard"
_SIZE_FILTER = "llmtrain_size_guard"


class TemplateBudgetError(Exception):
    """A template went over its budget. `kind`: "time" or "size"; `line`: the template line
    where it stopped, when known (set by whoever catches it, from the traceback)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.line: int | None = None


class _Watch:
    """The budget of the conversation being rendered: a deadline and an output size."""

    __slots__ = ("chars", "deadline", "limits")

    def __init__(self, limits: DataLimits):
        self.limits = limits
        self.chars = limits.output_chars
        self.deadline = time.monotonic() + limits.template_seconds

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateBudgetError(
                "time",
                f"rendering this conversation took longer than {self.limits.template_seconds:g} s "
                "(real templates take milliseconds)",
            )

    def size(self, n: int, what: str, unit: str = "characters") -> None:
        if n > self.chars:
            raise TemplateBudgetError(
                "size",
                f"it would make {what} of {n:,} {unit}, over the {self.chars:,} one rendering "
                f"may produce (twice the record budget: {self.limits.raise_hint()})",
            )

    def result(self, value: Any, what: str = "a value") -> Any:
        if isinstance(value, (str, list, tuple)):
            self.size(len(value), what, "characters" if isinstance(value, str) else "items")
        return value


_ACTIVE: contextvars.ContextVar[_Watch | None] = contextvars.ContextVar("template_watch")


def _watch() -> _Watch:
    watch = _ACTIVE.get(None)
    # Outside `watching` (ChatTemplate.render always opens one): the default budget, from now.
    return watch if watch is not None else _Watch(DataLimits())


@contextlib.contextmanager
def watching(limits: DataLimits) -> Iterator[_Watch]:
    """Render under `limits` within (one conversation: all its renderings share the deadline);
    nested uses keep the outer budget."""
    current = _ACTIVE.get(None)
    if current is not None:
        yield current
        return
    token = _ACTIVE.set(_Watch(limits))
    try:
        yield _watch()
    finally:
        _ACTIVE.reset(token)


def template_line(exc: BaseException) -> int | None:
    """The template line an exception raised while rendering came from (Jinja rewrites the
    traceback so that template code shows as frames of "<template>")."""
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def stream(compiled: Any, context: dict[str, Any]) -> str:
    """The template's text, counted as it streams out (TemplateBudgetError with the line that
    was writing when the output budget ran out)."""
    watch = _watch()
    pieces: list[str] = []
    total = 0
    generator = compiled.generate(**context)
    for piece in generator:
        total += len(piece)
        if total > watch.chars:
            error = TemplateBudgetError(
                "size",
                f"its text grew past the {watch.chars:,} characters one rendering may produce "
                f"(twice the record budget: {watch.limits.raise_hint()})",
            )
            error.line = _writing_line(compiled, generator)
            generator.close()
            raise error
        pieces.append(piece)
    return "".join(pieces)


def _writing_line(compiled: Any, generator: Any) -> int | None:
    inner = generator
    while getattr(inner, "gi_yieldfrom", None) is not None:
        inner = inner.gi_yieldfrom
    frame = getattr(inner, "gi_frame", None)
    return None if frame is None else int(compiled.get_corresponding_lineno(frame.f_lineno))


# --- size checks before an operation is made -----------------------------------------------------
_PERCENT_FIELD = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")
_FORMAT_SPEC = re.compile(r"\{[^{}]*:([^{}]*)\}")


def _number(digits: str) -> int:
    return 10**15 if len(digits) > 15 else int(digits)


def _percent(watch: _Watch, fmt: Any, args: Any) -> None:
    """`fmt % args`: no width or precision over the budget (also a `*` one taken from args)."""
    if not isinstance(fmt, str) or "%" not in fmt:
        return
    star = False
    for match in _PERCENT_FIELD.finditer(fmt):
        for group in match.groups():
            if group == "*":
                star = True
            elif group:
                watch.size(_number(group), "a formatted field")
    if star:
        for value in args if isinstance(args, tuple) else (args,):
            if isinstance(value, int):
                watch.size(abs(value), "a formatted field")


def _str_format(watch: _Watch, fmt: str) -> None:
    for spec in _FORMAT_SPEC.findall(fmt):
        for digits in re.findall(r"\d+", spec):
            watch.size(_number(digits), "a formatted field")


def _times(watch: _Watch, left: Any, right: Any) -> None:
    sized, count = (left, right) if isinstance(right, int) else (right, left)
    if isinstance(sized, (str, list, tuple)) and isinstance(count, int):
        watch.size(len(sized) * max(count, 0), "a repeated value")
    elif isinstance(left, int) and isinstance(right, int):
        watch.size((left.bit_length() + right.bit_length()) // 8, "a number", "bytes")


def _power(watch: _Watch, left: Any, right: Any) -> None:
    if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
        watch.size(left.bit_length() * right // 8, "a number", "bytes")


def _plus(watch: _Watch, left: Any, right: Any) -> None:
    if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
        watch.size(len(left) + len(right), "a joined value")


_BINOPS: dict[str, Callable[[_Watch, Any, Any], None]] = {
    "*": _times,
    "**": _power,
    "+": _plus,
    "%": _percent,
}


def _replaced(watch: _Watch, s: Any, old: Any, new: Any, count: Any = -1) -> None:
    if not (isinstance(s, str) and isinstance(old, str) and isinstance(new, str)):
        return
    hits = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    watch.size(len(s) + hits * (len(new) - len(old)), "a replaced string")


def _str_method(watch: _Watch, method: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Width and size checks of a str method about to be called."""
    name = getattr(method, "__name__", "")
    wrapped = getattr(method, "__wrapped__", None)  # the sandbox's str.format wrapper
    owner = getattr(wrapped if wrapped is not None else method, "__self__", None)
    if not isinstance(owner, str):
        return
    if name in ("ljust", "rjust", "center", "zfill") and args and isinstance(args[0], int):
        watch.size(args[0], "a padded string")
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(size, int):
            watch.size(len(owner) + owner.count("\t") * size, "a string with tabs expanded")
    elif name == "replace" and len(args) >= 2:
        _replaced(watch, owner, *args[:3])
    elif name in ("format", "format_map"):
        _str_format(watch, owner)


# --- filters and globals, each behind the guard -------------------------------------------------
def _pre_center(watch: _Watch, value: Any, width: Any = 80, *rest: Any, **kw: Any) -> None:
    if isinstance(width, int):
        watch.size(width, "a padded string")


def _pre_indent(watch: _Watch, s: Any, width: Any = 4, *rest: Any, **kw: Any) -> None:
    if isinstance(s, str):
        pad = width if isinstance(width, int) else len(str(width))
        watch.size(len(s) + pad * (s.count("\n") + 1), "an indented string")


def _pre_format(watch: _Watch, value: Any, *args: Any, **kwargs: Any) -> None:
    _percent(watch, value, args or kwargs)


def _pre_replace(
    watch: _Watch, s: Any, old: Any = "", new: Any = "", *rest: Any, **kw: Any
) -> None:
    _replaced(watch, s, old, new, rest[0] if rest else kw.get("count", -1))


def _pre_count(watch: _Watch, value: Any, count: Any = 1, *rest: Any, **kw: Any) -> None:
    if isinstance(count, int):
        watch.size(count, "a batch or slice")


_PRECHECKS: dict[str, Callable[..., None]] = {
    "center": _pre_center,
    "indent": _pre_indent,
    "format": _pre_format,
    "replace": _pre_replace,
    "batch": _pre_count,
    "slice": _pre_count,
}


def _guarded(function: Callable[..., Any], precheck: Callable[..., None] | None) -> Any:
    """`function` (a filter or global) behind the guard: the clock, `precheck`, its result's
    size. Jinja's pass_context / pass_eval_context marks are kept (functools.wraps)."""
    passes_first = hasattr(function, "jinja_pass_arg")

    @functools.wraps(function)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        watch = _watch()
        watch.tick()
        if precheck is not None:
            precheck(watch, *(args[1:] if passes_first else args), **kwargs)
        return watch.result(function(*args, **kwargs))

    return guarded


def _loop_guard(iterable: Iterable[Any]) -> Iterator[Any]:
    """What every {% for %} iterates through: the clock at every item."""
    watch = _watch()
    deadline, clock = watch.deadline, time.monotonic
    for item in iterable:
        if clock() > deadline:
            watch.tick()
        yield item


def _size_guard(value: Any) -> Any:
    """What every `~` makes, measured."""
    return _watch().result(value, "a joined value")


def _pre_lipsum(watch: _Watch, n: Any = 5, html: Any = True, low: Any = 1, high: Any = 100) -> None:
    if isinstance(n, int) and isinstance(high, int):
        watch.size(n * high * 12, "lorem ipsum")


def _raise_exception(message: str) -> None:
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    if isinstance(indent, int) and indent > 0:
        values, depth = _shape(value)
        _watch().size(indent * values * depth, "indented JSON")
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _shape(value: Any) -> tuple[int, int]:
    """(values, deepest nesting) of a JSON document: indented, each value takes a line of at
    most depth x indent spaces."""
    stack, values, depth = [(value, 1)], 0, 1
    while stack:
        item, level = stack.pop()
        values += 1
        depth = max(depth, level)
        if isinstance(item, dict):
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend((v, level + 1) for v in item)
    return values, depth


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@cache
def _guard_tree(tree: Any, nodes: Any) -> Any:
    """The parsed template `tree`, every {% for %} iterating through the loop guard and every `~`
    measured (a Concat node is no operator the sandbox intercepts); `nodes`: jinja2.nodes."""

    def measured(node: Any) -> Any:
        return nodes.Filter(node, _SIZE_FILTER, [], [], None, None, lineno=node.lineno)

    for loop in tree.find_all(nodes.For):
        loop.iter = nodes.Filter(
            loop.iter, _LOOP_FILTER, [], [], None, None, lineno=loop.iter.lineno
        )
    for parent in list(tree.find_all(nodes.Node)):
        for field, value in parent.iter_fields():
            if isinstance(value, nodes.Concat):
                setattr(parent, field, measured(value))
            elif isinstance(value, list):
                value[:] = [measured(v) if isinstance(v, nodes.Concat) else v for v in value]
    return tree


def environment() -> Any:
    """The sandboxed environment, built once (jinja2 is imported here only)."""
    try:
        import jinja2
        import jinja2.ext
        import jinja2.nodes
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise UserError(
            "chat templates need jinja2: pip install 'llmtrain[train]' (or pip install jinja2)"
        ) from None

    class GenerationBlock(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: rendered as its body."""

        tags = {"generation"}  # noqa: RUF012 (jinja2's Extension declares a set)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_body")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _body(self, caller: Callable[[], str]) -> str:
            return caller()

    class Namespace(jinja2.utils.Namespace):
        """jinja's namespace, refusing underscore-prefixed attribute names."""

        def __init__(*args: Any, **kwargs: Any) -> None:
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"a chat template cannot set the underscore-prefixed attribute {name!r}"
                )

    class TemplateDict:
        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    class GuardedEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(_BINOPS)

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            watch = _watch()
            if operator == "+" and type(left) is str and type(right) is str:  # the common one
                if len(left) + len(right) > watch.chars:
                    watch.size(len(left) + len(right), "a joined value")
                return left + right
            _BINOPS[operator](watch, left, right)
            return watch.result(super().call_binop(context, operator, left, right))

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            watch = _watch()
            watch.tick()
            _str_method(watch, __obj, args, kwargs)
            return watch.result(super().call(__context, __obj, *args, **kwargs))

        def _parse(self, source: str, name: str | None, filename: str | None) -> Any:
            return _guard_tree(super()._parse(source, name, filename), jinja2.nodes)

    env = GuardedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    for name, function in list(env.filters.items()):
        env.filters[name] = _guarded(function, _PRECHECKS.get(name))
    env.filters[_LOOP_FILTER] = _loop_guard
    env.filters[_SIZE_FILTER] = _size_guard
    lipsum: Callable[..., Any] = env.globals["lipsum"]  # type: ignore[assignment]
    env.globals["lipsum"] = _guarded(lipsum, _pre_lipsum)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = Namespace
    return env
