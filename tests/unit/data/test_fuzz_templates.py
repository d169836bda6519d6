"""Property-based: generated hostile chat templates (issue 42), the companion of
tests/unit/test_fuzz_files.py for what a template can do rather than what a file holds.

A template is drawn from a grammar of what costs time or memory in Jinja: nested loops over large
ranges, repetition, `%` and `str.format` widths, powers, padding and indenting methods and
filters, `tojson` indents, `lipsum`, batches, string doubling in a namespace or with `~`,
recursion, and `raise_exception` with escape bytes and 20,000 characters, mixed with the
conversation's own text.
Each is rendered in this process under a small budget (1 s, 1 MiB records: 2 MiB of output): it
must end within a few seconds, either with its text (no longer than the budget) or with a
TemplateRenderError whose message is short and holds no escape byte and no long run of the
template's text. What the guard cannot see is for the worker (data/test_hostile_templates.py,
bench/fuzz_cli.py --templates); one example here runs the real entry point in a child process.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.data.limits import DataLimits
from launcher.data.templating.chat_template import ChatTemplate, TemplateRenderError
from launcher.errors import UserError

ESC = "\x1b[2J"
LIMITS = DataLimits(record_bytes=1 << 20, template_seconds=1.0)
LIMIT_S = 8  # one template, budget and message included
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Say hi " + ESC},
    {"role": "assistant", "content": "Hi!"},
]

NUMBERS = st.sampled_from(["0", "1", "-1", "7", "255", "100000", "1000000000", "4000000000",
                           "18446744073709551616"])  # fmt: skip
TEXTS = st.sampled_from([
    "'x'", "'ab'", "messages[1].content", "'\\x1b[2J'", "'%0999999999d'", "'{:>999999999}'",
    "'a\\nb'", "('A' * 20000)", "'%*d'", "(range(3) | list)",
])  # fmt: skip


def _expressions(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    n = NUMBERS
    return st.one_of(
        st.builds("({} * {})".format, inner, n),
        st.builds("({} % {})".format, inner, n),
        st.builds("({} % ({}, {}))".format, inner, n, n),
        st.builds("({} ** {})".format, n, n),
        st.builds("({} + {})".format, inner, inner),
        st.builds("({} ~ {})".format, inner, inner),
        st.builds("{}.ljust({})".format, inner, n),
        st.builds("{}.center({})".format, inner, n),
        st.builds("({}|string).replace('a', {})".format, inner, inner),
        st.builds("{}.format({})".format, inner, n),
        st.builds("({} | center({}))".format, inner, n),
        st.builds("({} | string | indent({}))".format, inner, n),
        st.builds("({} | format({}))".format, inner, n),
        st.builds("(range({}) | list | tojson(indent={}))".format, n, n),
        st.builds("lipsum({})".format, n),
        st.builds("([{}] | batch({}, 'x') | list | length)".format, inner, n),
    )


EXPRESSIONS = st.recursive(TEXTS | NUMBERS, _expressions, max_leaves=4)


def _statements(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.builds("{{% for i in range({}) %}}{}{{% endfor %}}".format, NUMBERS, inner),
        st.builds("{{% if {} %}}{}{{% endif %}}".format, EXPRESSIONS, inner),
        st.builds(lambda a, b: a + "\n" + b, inner, inner),
    )


LEAVES = st.one_of(
    st.builds("{{{{ {} }}}}".format, EXPRESSIONS),
    st.builds("{{% set ns.s = ns.s ~ {} %}}".format, EXPRESSIONS),
    st.builds("{{% set v = {} %}}{{% set v = v ~ v ~ v %}}{{{{ v|length }}}}".format, EXPRESSIONS),
    st.builds("{{{{ raise_exception({}) }}}}".format, EXPRESSIONS),
    st.just("{% macro f(n) %}{{ f(n) }}{{ f(n) }}{% endmacro %}{{ f(1) }}"),
    st.just(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    ),
)
TEMPLATES = st.recursive(LEAVES, _statements, max_leaves=5).map(
    lambda body: "{% set ns = namespace(s='') %}" + body
)


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """AssertionError in this (main) thread after `seconds`: a template that blocks fails."""

    def expired(signum: int, frame: object) -> None:
        raise AssertionError(f"the template ran past {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def check(source: str) -> str:
    """Render `source` under LIMITS; what a user would read (the text or the message)."""
    template = ChatTemplate(source, {"eos_token": "<|im_end|>"}, "fuzz.jinja")
    start = time.monotonic()
    with _alarm(LIMIT_S):
        try:
            template.check()
            text, _ = template.conversation(MESSAGES, ("<|im_end|>",), LIMITS)
        except (TemplateRenderError, UserError) as exc:
            said = str(exc)
            assert ESC not in said and "A" * 201 not in said, said[:500]
            assert len(said) < 600, said[:600]
            return said
    assert time.monotonic() - start < LIMIT_S
    assert len(text) <= LIMITS.output_chars
    return text


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(source=TEMPLATES)
def test_generated_templates_end_in_their_budget_with_a_short_message(source: str) -> None:
    check(source)


def test_the_grammar_reaches_every_guard() -> None:
    """The strategies can draw what each guard stops (so the property test exercises them)."""
    for source, says in [
        ("{{ ('x' * 4000000000) }}", "repeated value"),
        ("{% for i in range(100000) %}{% for i in range(100000) %}{% endfor %}{% endfor %}",
         "longer than 1 s"),
        ("{{ raise_exception(('A' * 20000)) }}", "(20,000 characters)"),
        ("{% set ns.s = ns.s ~ ('x' * 1000000) %}{% set ns.s = ns.s ~ ns.s ~ ns.s %}",
         "a joined value of 3,000,000"),
    ]:  # fmt: skip
        assert says in check("{% set ns = namespace(s='') %}" + source)


@pytest.mark.integration
def test_a_hostile_template_through_the_real_entry_point(tmp_path: Path) -> None:
    """`python -m launcher data prepare` in a child process, its worker in a grandchild."""
    from tests.chat_fixtures import build_tokenizer
    from tests.cli import llmtrain

    tok = build_tokenizer("qwen2.5", tmp_path / "tok")
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"messages": MESSAGES[1:]}) + "\n")
    template = tmp_path / "t.jinja"
    template.write_text("{{ raise_exception('\x1b[2J' + 'A' * 20000) }}{{ 'x' * 4000000000 }}")
    done = llmtrain("data", "prepare", "--input", str(data), "--tokenizer", str(tok),
                    "--chat-template", str(template), "--output", str(tmp_path / "out"),
                    timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and ESC not in done.stderr
    assert "chat.jsonl:1" in done.stderr and len(done.stderr) < 2000, done.stderr
