"""Reading a published command line as a shell would split it, without a shell.

A recipe's `docker run ... \\` spans many lines, quotes JSON in single quotes, names values
as `$VAR`, `${VAR}` or `"${VAR}"`, and sometimes annotates a line with `# why` after its
backslash (seed 000 writes its reasons that way). `command_at()` reads the
command that starts on a given line as a list of `Word`s: the text shlex gives, the placeholders it holds, and the
comment of the line it came from. Nothing is expanded and nothing is run: a placeholder
stays a marker until the importer decides what it becomes; `$(...)` and backticks are
refused, since only a shell could know their value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from laned.errors import CommandLineError

# A placeholder inside a word, between these two private-use characters, shlex-proof.
OPEN, CLOSE = "\ue000", "\ue001"
PLACEHOLDER = re.compile(f"{OPEN}([A-Za-z_][A-Za-z0-9_]*){CLOSE}")
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
SEPARATORS = {"&&", "||", ";", "|"}


@dataclass(frozen=True)
class Word:
    """One argv word: its text (placeholders as OPEN name CLOSE), the line it starts on, and
    the `# comment` at the end of that line, if any."""

    text: str
    line: int
    comment: str = ""

    def shown(self) -> str:
        """The word as the recipe wrote it: `${NAME}` for each placeholder."""
        return shown(self.text)


def shown(text: str) -> str:
    """Text as the recipe wrote it: `${NAME}` for each placeholder marker."""
    return PLACEHOLDER.sub(r"${\1}", text)


@dataclass
class _Line:
    code: str
    number: int
    comment: str = ""


@dataclass
class _Scan:
    """Quote state carried from one physical line to the next."""

    quote: str = ""  # "", "'" or '"'
    lines: list[_Line] = field(default_factory=list)


# A run of characters that mean nothing to _mark, copied as they are.
_PLAIN = re.compile(r"[^'\"\\`$#]+")


def _mark(code: str, number: int, scan: _Scan) -> tuple[str, str]:
    """One physical line: placeholders marked outside single quotes; the comment split off.
    Returns (code, comment). Linear in the line: plain runs and single-quoted text are copied
    whole."""
    out: list[str] = []
    i = 0
    while i < len(code):
        if scan.quote == "'":
            end = code.find("'", i)
            if end < 0:
                out.append(code[i:])
                break
            out.append(code[i : end + 1])
            scan.quote = ""
            i = end + 1
            continue
        plain = _PLAIN.match(code, i)
        if plain:
            out.append(plain.group())
            i = plain.end()
            continue
        char = code[i]
        if char == "\\" and i + 1 < len(code):
            out.append(code[i : i + 2])
            i += 2
            continue
        if char == "`" or code.startswith("$(", i):
            raise CommandLineError(
                f"line {number}: command substitution ({code[i : i + 2].strip()}...) needs a shell",
                "replace it with its value, or with a ${NAME} placeholder and --set NAME=VALUE",
            )
        if char == "$":
            match = _VARIABLE.match(code, i)
            if match:
                out.append(OPEN + (match.group(1) or match.group(2)) + CLOSE)
                i = match.end()
                continue
        if char == '"':
            scan.quote = "" if scan.quote == '"' else '"'
        elif char == "'" and not scan.quote:
            scan.quote = "'"
        elif char == "#" and not scan.quote and (i == 0 or code[i - 1].isspace()):
            return "".join(out), code[i + 1 :].strip()
        out.append(char)
        i += 1
    return "".join(out), ""


def command_at(lines: list[str], start: int) -> list[Word]:
    """The command that begins on `lines[start]` (0-based), through its continuation lines,
    up to a separator (`&&`, `;`, `|`) or its end; prose around it is not read."""
    scan = _Scan()
    logical: list[_Line] = []
    for index in range(start, len(lines)):
        code, comment = _mark(lines[index], index + 1, scan)
        stripped = code.rstrip()
        continued = stripped.endswith("\\") and not stripped.endswith("\\\\")
        logical.append(_Line(stripped[:-1] if continued else code, index + 1, comment))
        if not continued and not scan.quote:
            break
    if scan.quote:
        raise CommandLineError(
            f"line {start + 1}: a {scan.quote} quote is never closed",
            "check the quoting of the command line",
        )
    words = _words(logical)
    cut = next((i for i, w in enumerate(words) if w.text in SEPARATORS), len(words))
    return words[:cut]


def _words(lines: list[_Line]) -> list[Word]:
    """Split a logical line; each word keeps the line it starts on and that line's comment."""
    words: list[Word] = []
    for index, line in enumerate(lines):
        try:
            parts = split(line.code)
        except ValueError:
            # A quote spans the backslash-joined lines: split them as one.
            joined = " ".join(item.code for item in lines[index:])
            comment = next((item.comment for item in lines[index:] if item.comment), "")
            try:
                parts = split(joined)
            except ValueError as exc:
                raise CommandLineError(
                    f"line {line.number}: {exc}", "check the quoting of the command line"
                ) from None
            return words + [Word(p, line.number, comment) for p in parts]
        words += [Word(p, line.number, line.comment) for p in parts]
    return words


# A shell word's pieces, as shlex.split (POSIX mode, no comments) reads them: a run of plain
# characters, a single-quoted string, a double-quoted one (where a backslash escapes only `"`
# and itself), a backslash and the character it escapes, blanks between words (shlex's: space,
# tab, CR, LF).
_PIECE = re.compile(r"""[^ \t\r\n'"\\]+|'[^']*'|"(?:[^"\\]|\\.)*"|\\.|[ \t\r\n]+""", re.DOTALL)
_ESCAPED = re.compile(r'\\([\\"])')


def split(code: str) -> list[str]:
    """The words of a line as `shlex.split(code)` gives them, in time linear in its length
    (shlex grows each word a character at a time, which is quadratic in a word's length:
    a 900 KB value took 20 s). Raises ValueError as shlex does: an unclosed quote, a
    backslash at the end."""
    words: list[str] = []
    word: list[str] | None = None  # None between words; a quoted '' still makes a word
    i = 0
    while i < len(code):
        piece = _PIECE.match(code, i)
        if piece is None:  # an unclosed quote, or a backslash with nothing after it
            raise ValueError("No escaped character" if code[i] == "\\" else "No closing quotation")
        text = piece.group()
        i = piece.end()
        if text[0] in " \t\r\n":
            if word is not None:
                words.append("".join(word))
                word = None
            continue
        if word is None:
            word = []
        if text[0] == "'":
            word.append(text[1:-1])
        elif text[0] == '"':
            word.append(_ESCAPED.sub(r"\1", text[1:-1]))
        elif text[0] == "\\":
            word.append(text[1])
        else:
            word.append(text)
    if word is not None:
        words.append("".join(word))
    return words
