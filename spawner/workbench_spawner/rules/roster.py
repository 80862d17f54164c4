"""A course's roster as a CSV file: its rows, or every bad line with its number and why.

The file an instructor exports from their student list: a header naming a
``username`` column (any case; other columns, such as a name or an e-mail,
are read past) and, optionally, a ``role`` column, one of ``student``
(the default), ``ta`` or ``instructor``. Names are trimmed and lower-cased as
JupyterHub's logins are; blank lines are skipped. A bad row (no name, a name
a login cannot have, an unknown role, a name twice) is reported with its
line number, and the whole file is refused: a roster is applied whole or not
at all (``workbench_hub.service.roster_handlers``).
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass

ROLES = ("student", "ta", "instructor")
STAFF_ROLES = ("ta", "instructor")
MAX_ROWS = 5000
MAX_ERRORS_SHOWN = 20
# What NativeAuthenticator and a Unix account accept: no spaces, commas or slashes; not an option's dash.
NAME = re.compile(r"^[^\s,/-][^\s,/]{0,254}$")


@dataclass(frozen=True)
class RosterRow:
    line: int
    username: str
    role: str = "student"


class RosterError(ValueError):
    """A roster refused; ``problems`` are its sentences ("line 7: ..."), str(err) all of them."""

    def __init__(self, problems: list[str]):
        shown = problems[:MAX_ERRORS_SHOWN]
        more = len(problems) - len(shown)
        super().__init__("; ".join(shown) + (f"; and {more} more" if more > 0 else ""))
        self.problems = problems


def parse_roster(text: str) -> list[RosterRow]:
    """The rows of a roster CSV, or RosterError naming every bad line (nothing is applied then)."""
    reader = csv.reader(io.StringIO(text.lstrip("\ufeff")))
    header: list[str] | None = None
    rows: list[RosterRow] = []
    problems: list[str] = []
    seen: dict[str, int] = {}
    try:
        for fields in reader:
            line = reader.line_num
            if not any(f.strip() for f in fields):
                continue
            if header is None:
                header = [f.strip().lower() for f in fields]
                if "username" not in header:
                    raise RosterError(
                        [f"line {line}: the first line must name the columns, one of them username (found {fields!r})"]
                    )
                continue
            cells = dict(zip(header, (f.strip() for f in fields), strict=False))
            name = (cells.get("username") or "").lower()
            role = (cells.get("role") or "student").lower()
            if not name:
                problems.append(f"line {line}: no username")
            elif not NAME.match(name):
                problems.append(f"line {line}: {name!r} cannot be a login name (no spaces, commas or slashes)")
            elif name in seen:
                problems.append(f"line {line}: {name} is on line {seen[name]} already")
            if role not in ROLES:
                problems.append(f"line {line}: role {role!r} is not one of {', '.join(ROLES)}")
            if name and name not in seen:
                seen[name] = line
            rows.append(RosterRow(line, name, role))
            if len(rows) > MAX_ROWS:
                raise RosterError([f"line {line}: a roster has at most {MAX_ROWS} rows; split the file"])
    except csv.Error as exc:
        raise RosterError([f"line {reader.line_num}: not CSV ({exc})"]) from None
    if header is None:
        raise RosterError(["the file is empty: its first line must name the columns, one of them username"])
    if problems:
        raise RosterError(problems)
    if not rows:
        raise RosterError(["the file names no one: add a line per student under the header"])
    return rows
