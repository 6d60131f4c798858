"""
Templates and scripts: every file sparkrig writes and every host-side script is a file under
``templates/`` (shipped inside the package, :mod:`sparkrig.resources`), rendered here with
jinja2. Undefined names are errors; ``{{ value | q }}`` is one word for sh.
"""

from __future__ import annotations

import re
import shlex

import jinja2

from .resources import TEMPLATES

_jinja = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(TEMPLATES)),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    autoescape=False,
)
# `{{ value | q }}`: one word for sh, whatever the value holds.
_jinja.filters["q"] = shlex.quote


_LITERAL_WORD = re.compile(r"[A-Za-z0-9_./:+,=@%-]*")


def quote_literal(value: str) -> str:
    """Quote a value so sh and systemd (``EnvironmentFile=``, ``$VAR`` splitting) read it
    back literally: as it is when it holds only safe characters, else single-quoted.

    Both take single-quoted text literally; callers' settings validation keeps single
    quotes and newlines out of the value.
    """
    return value if _LITERAL_WORD.fullmatch(value) else f"'{value}'"


def render(template: str, **context) -> str:
    """Render ``templates/<template>`` with ``context``; undefined names are errors."""
    return _jinja.get_template(template).render(**context)


def script(template: str, **context) -> str:
    """A host-side script of ``templates/`` (every one is a file there, shellchecked by
    tests/repo/test_shell.py) as ``sh -c`` takes it: rendered, without its comment lines
    (those starting with ``#``) and blank lines, which would only lengthen each command."""
    lines = render(template, **context).splitlines()
    return "\n".join(line for line in lines if line.strip() and not line.startswith("#"))
