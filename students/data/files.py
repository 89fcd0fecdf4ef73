"""Reading a saved student's files (its sidecar, config.json, exits.json, tokenizer): the one error a
damaged file raises, what it says about a JSON value of the wrong kind, and what to do about it.
"""
from __future__ import annotations

import json
from typing import Any

from transferset.contract import schema
from transferset.runtime.errors import UserError


class StudentFileError(UserError, ValueError):
    """A saved student's files (its sidecar, config.json, tokenizer) cannot be read: damaged, or not a student's."""


# What to do about a saved student whose files are damaged: its messages end with this.
RESAVE = "train the student again (`transferset train`), or copy its folder again"

# A JSON value's kind, for messages about a file that holds another kind than it should.
JSON_KINDS = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
              float: "a number", type(None): "null"}


def json_kind(value: Any) -> str:
    return JSON_KINDS.get(type(value), type(value).__name__)


def json_phrase(value: Any) -> str:
    """"a JSON list", "a JSON string", "JSON null": what a file holds instead of an object."""
    kind = json_kind(value)
    return "JSON null" if value is None else kind.replace(" ", " JSON ", 1)


def read_json_object(path: str, *, holds: str, remedy: str) -> dict:
    """A JSON file that must hold an object; anything else is one StudentFileError naming the file.

    `holds` says what the object should hold (for the message), `remedy` what to do about it.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            value = json.load(fh)
    except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8
        raise StudentFileError(f"{path}: not a JSON file ({exc}); {remedy}") from exc
    if not isinstance(value, dict):
        raise StudentFileError(f"{path}: holds {json_phrase(value)}, not an object ({schema.cut(value, 100)}; "
                               f"{holds}); {remedy}")
    return value
